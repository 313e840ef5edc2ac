//! In-flight latency (`detect: running`): the calls that have run longer than their rule's
//! `min_duration` and are still running are found by the agent's periodic scan of
//! `ENTRY_TIMES` and `SYSCALL_START`; these programs give it what the kernel alone can.
//!
//! - Looks: the registers and user stack of a thread the scan names in `WANT_LOOK`, taken
//!   either on its CPU by `inflight_tick` (the thread is running) or by the task
//!   iterator `inflight_look`
//!   while the thread is off CPU — copied only when its switch counts and `on_cpu` are the
//!   same before and after the copy, so the copy is the stack of one moment at which the
//!   thread did not run. Userspace unwinds a function call's look and checks that the
//!   probed function's frame is still there (a sibling called from the same site at the
//!   same height is not it).
//! - `inflight_fire` (run by the agent with `BPF_PROG_TEST_RUN`, never attached): checks
//!   again that the call is still the one in the map (the entry frame, or the syscall's
//!   start, unchanged), and fires it through `emit::fire` — the cooldown, hourly limit and
//!   in-kernel freeze of every other trigger — once per call (`INFLIGHT_REPORTED`).
use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, write_volatile},
};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{pt_regs, task_struct},
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_copy_from_user_task, bpf_probe_read_kernel, bpf_task_pt_regs},
    },
    programs::RawTracePointContext,
};
use lookback_common::{
    MAX_RULES,
    rule::{
        EntryKey, FLAG_RUNNING, INFLIGHT_FUNCTION, InflightKey, KIND_FUNCTION, KIND_SYSCALL,
        LOOK_ITER, LOOK_SAMPLE, MAX_CALL_DEPTH,
    },
    trigger::{PHASE_RUNNING, TRIGGER_STACK_COPY, TriggerRecord, TriggerStackCopy},
};

use crate::{
    emit::{Firing, copy_stack, fire, now_ns},
    maps::{
        ENTRY_TIMES, INFLIGHT_REPORTED, LOOKS, RULES, SYSCALL_START, WANT_LOOK, config, rule_slots,
    },
};

/// The watcher's CPU ticks (a `cpu-clock` event per CPU, every 10 ms, enabled only while
/// a look is wanted): the thread on the CPU fills its look if the scan asked for one.
/// Keeps no sample (returns 0).
#[unsafe(no_mangle)]
#[unsafe(link_section = "perf_event")]
pub extern "C" fn inflight_tick(_ctx: *mut c_void) -> u32 {
    look_at_current(bpf_get_current_pid_tgid() as u32);
    0
}

/// Fills the look the scan asked for at the current thread, if any. One hash lookup when
/// none is wanted.
#[inline(always)]
fn look_at_current(tid: u32) {
    // SAFETY: a plain u32 value.
    let Some(&slot) = (unsafe { WANT_LOOK.get(tid) }) else {
        return;
    };
    let Some(look) = LOOKS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: `look` points at a preallocated array value; the scan reads it only after
    // the `WANT_LOOK` entry is gone, which is removed after these writes.
    unsafe {
        copy_stack(addr_of_mut!((*look).copy));
        write_volatile(addr_of_mut!((*look).tid), tid);
        write_volatile(addr_of_mut!((*look).how), LOOK_SAMPLE);
        write_volatile(addr_of_mut!((*look).look_ns), now_ns());
    }
    let _ = WANT_LOOK.remove(tid);
}

/// The task iterator (`iter.s/task`: sleepable, for `bpf_copy_from_user_task`). The
/// agent reads it once per scan that has threads off CPU to look at.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter.s/task")]
pub extern "C" fn inflight_look(ctx: *mut c_void) -> i32 {
    let _ = try_look(ctx);
    0
}

/// A `u64`-sized field of kernel memory at `base + offset`; `None` when it faults.
#[inline(always)]
fn kernel_word(base: *const u8, offset: u32, size: u32) -> Option<u64> {
    let mut value: u64 = 0;
    // SAFETY: the helper writes at most `size` (≤ 8) bytes into `value`, faults safely.
    let rc = unsafe {
        bpf_probe_read_kernel(
            addr_of_mut!(value).cast(),
            size & 15,
            base.wrapping_add(offset as usize).cast(),
        )
    };
    (rc == 0).then_some(value)
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
    let tid = kernel_word(base, config.task_pid_offset, 4)? as u32;
    // SAFETY: a plain u32 value.
    let slot = *unsafe { WANT_LOOK.get(tid) }?;
    let look = LOOKS.get_ptr_mut(slot)?;
    let state =
        || -> Option<(u64, u64)> {
            let on_cpu = kernel_word(base, config.task_on_cpu_offset, 4)? & 0xffff_ffff;
            let switches = kernel_word(base, config.task_nvcsw_offset, 8)?
                .wrapping_add(kernel_word(base, config.task_nivcsw_offset, 8)?);
            Some((on_cpu, switches))
        };
    let before = state()?;
    if before.0 != 0 {
        return None; // running: its own next sample takes the look
    }
    // SAFETY: `task` is the iterator's live task; the regs pointer is only read through
    // `bpf_probe_read_kernel`.
    let regs = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    let word = |at: *const u64| kernel_word(at.cast(), 0, 8);
    // SAFETY: field addresses of the kernel's pt_regs, read through the checked helper.
    let (ip, sp, bp) = unsafe {
        (
            word(addr_of!((*regs).rip))?,
            word(addr_of!((*regs).rsp))?,
            word(addr_of!((*regs).rbp))?,
        )
    };
    // SAFETY: `look` points at a preallocated array value the scan reads only after the
    // `WANT_LOOK` entry is removed below.
    let copy: *mut TriggerStackCopy = unsafe { addr_of_mut!((*look).copy) };
    let len = copy_user_stack(copy, sp, task);
    if len == 0 || state()? != before {
        return None; // it ran meanwhile: the next scan tries again
    }
    // SAFETY: as above.
    unsafe {
        write_volatile(addr_of_mut!((*copy).ip), ip);
        write_volatile(addr_of_mut!((*copy).sp), sp);
        write_volatile(addr_of_mut!((*copy).bp), bp);
        write_volatile(addr_of_mut!((*copy).len), len);
        write_volatile(addr_of_mut!((*look).tid), tid);
        write_volatile(addr_of_mut!((*look).how), LOOK_ITER);
        write_volatile(addr_of_mut!((*look).look_ns), now_ns());
    }
    let _ = WANT_LOOK.remove(tid);
    Some(())
}

/// Copies `task`'s user stack from `sp` upwards into `copy.bytes` (8 KiB, else to the end
/// of SP's page or the next one, as `emit::copy_stack`); the bytes copied, 0 on failure.
#[inline(always)]
fn copy_user_stack(copy: *mut TriggerStackCopy, sp: u64, task: *mut task_struct) -> u64 {
    // SAFETY: `copy.bytes` is writable for TRIGGER_STACK_COPY bytes; the helper copies at
    // most the size given from the task's memory, or fails (and zeroes).
    unsafe {
        let dst: *mut c_void = addr_of_mut!((*copy).bytes).cast();
        let from = sp as *const c_void;
        let in_page = 4096 - (sp & 4095);
        let two_pages = (in_page + 4096) & 8191;
        let full = TRIGGER_STACK_COPY as u32;
        if bpf_copy_from_user_task(dst, full, from, task, 0) == 0 {
            u64::from(full)
        } else if two_pages != 0
            && bpf_copy_from_user_task(dst, two_pages as u32, from, task, 0) == 0
        {
            two_pages
        } else if bpf_copy_from_user_task(dst, (in_page & 8191) as u32, from, task, 0) == 0 {
            in_page
        } else {
            0
        }
    }
}

/// Fires one call in flight; run by the agent (`BPF_PROG_TEST_RUN`) with the arguments
/// `lookback_common::rule::INFLIGHT_*` names. Returns 1 when a trigger was sent (written
/// without `#[raw_tracepoint]`: that macro returns 0 whatever the function returns).
#[unsafe(no_mangle)]
#[unsafe(link_section = "raw_tp/lookback_inflight")]
pub extern "C" fn inflight_fire(ctx: *mut c_void) -> i32 {
    let ctx = RawTracePointContext::new(ctx);
    i32::from(try_fire(&ctx).unwrap_or(false))
}

fn try_fire(ctx: &RawTracePointContext) -> Option<bool> {
    let kind: u64 = ctx.arg(0);
    let thread: u64 = ctx.arg(1);
    let pid_tgid: u64 = ctx.arg(2);
    let entry_ns: u64 = ctx.arg(4);
    let tgid = (pid_tgid >> 32) as u32;
    let key = InflightKey { thread, entry_ns };
    // SAFETY: a plain u64 value.
    let already = unsafe { INFLIGHT_REPORTED.get(key) }.copied().unwrap_or(0);
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
    let mut firing = Firing::default();
    let met = if kind == INFLIGHT_FUNCTION {
        function_met(ctx, &key, tgid, already, &mut record, &mut firing)?
    } else {
        syscall_met(
            pid_tgid as u32,
            entry_ns,
            tgid,
            already,
            &mut record,
            &mut firing,
        )?
    };
    if met == 0 {
        return Some(false);
    }
    let _ = INFLIGHT_REPORTED.insert(key, already | met, 0);
    let sent = firing.rules != 0;
    fire(ctx.as_ptr(), firing, record, false);
    Some(sent)
}

/// A function call: still the frame at the given height with the given entry time in
/// `ENTRY_TIMES`, of a `detect: running` rule, old enough at the look. Returns the rule's
/// bit (0: nothing to fire).
#[inline(always)]
fn function_met(
    ctx: &RawTracePointContext,
    key: &InflightKey,
    tgid: u32,
    already: u64,
    record: &mut TriggerRecord,
    firing: &mut Firing,
) -> Option<u64> {
    let rule_id = ctx.arg::<u64>(3) as u32;
    let look_ns: u64 = ctx.arg(5);
    let height: u64 = ctx.arg(6);
    if rule_id >= MAX_RULES || rule_id >= rule_slots() || already & (1 << rule_id) != 0 {
        return Some(0);
    }
    let rule = RULES.get(rule_id)?;
    if rule.kind != KIND_FUNCTION || rule.flags & FLAG_RUNNING == 0 {
        return Some(0);
    }
    let entry_key = EntryKey {
        thread: key.thread,
        tgid,
        rule_id,
    };
    // SAFETY: plain-data value, read only.
    let stack = unsafe { ENTRY_TIMES.get(entry_key) }?;
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
        return Some(0); // a later entry replaced it: the call ended
    };
    let duration = look_ns.saturating_sub(frame.entry_ns);
    if look_ns == 0 || duration < rule.min_duration_ns {
        return Some(0);
    }
    firing.add(rule_id, rule, look_ns, tgid);
    record.kind = KIND_FUNCTION;
    record.timestamp_ns = look_ns;
    record.duration_ns = duration;
    record.ip = frame.func;
    record.depth = depth as u32;
    Some(1 << rule_id)
}

/// A syscall: the thread's `SYSCALL_START` still the one that entered at `entry_ns`, for
/// the `detect: running` syscall rules that applied at entry and whose threshold it
/// passed. Returns their bits.
#[inline(always)]
fn syscall_met(
    thread: u32,
    entry_ns: u64,
    tgid: u32,
    already: u64,
    record: &mut TriggerRecord,
    firing: &mut Firing,
) -> Option<u64> {
    let config = config()?;
    // SAFETY: plain-data value copied out.
    let start = unsafe { SYSCALL_START.get(thread) }.copied()?;
    if start.enter_ns != entry_ns {
        return Some(0);
    }
    let now = now_ns();
    let duration = now.saturating_sub(entry_ns);
    let mask = start.rules & config.running_rules & config.syscall_rules & !already;
    let mut met = 0u64;
    let slots = rule_slots();
    for rule_id in 0..MAX_RULES {
        if rule_id >= slots || mask >> rule_id == 0 {
            break;
        }
        if mask & (1 << rule_id) == 0 {
            continue;
        }
        let Some(rule) = RULES.get(rule_id) else {
            continue;
        };
        if rule.has_syscall(start.nr) && duration >= rule.min_duration_ns {
            firing.add(rule_id, rule, now, tgid);
            met |= 1 << rule_id;
        }
    }
    record.kind = KIND_SYSCALL;
    record.timestamp_ns = now;
    record.duration_ns = duration;
    record.syscall_nr = start.nr as u32;
    Some(met)
}
