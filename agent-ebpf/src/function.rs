//! Function triggers. Entry-only rules fire at the entry uprobe. Latency rules measure each
//! call between its entry uprobe and the uprobe on the instruction that leaves the function
//! (`ret`, a tail-call jump), found by disassembling the function in userspace: the return
//! address on the target's stack is never replaced, so C++ exceptions, Rust panics, longjmp
//! and Go's stack copying see the stack they expect. (A uretprobe, which does replace it,
//! runs only on explicit request: `function_return`.)
//!
//! Each thread (Go: each goroutine) keeps a stack of its calls in flight as (height, entry
//! time); height is the stack pointer at entry (Go: its distance from the goroutine stack's
//! top). At an entry and at an exit, SP points at the return address, so:
//! - an entry first drops the frames at or below its own height: they can only have been
//!   abandoned (longjmp, an exception, a panic) — their calls are not measured (`unwound`);
//! - an exit drops the frames below its height (abandoned the same way) and pops the one
//!   at its height; no frame there → `unmatched_return`.
//!
//! So the per-thread stack can never wedge, and a stale frame can never produce a duration.
//! Probe attach cookies (`lookback_common::probe`) carry the rule and the kind of site.
use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    maps::{Array, LruHashMap},
    programs::{ProbeContext, RetProbeContext},
};
use lookback_common::{
    MAX_RULES,
    probe::{
        MAX_CODE_RANGES, REG_NONE, REG_RIP, SITE_COND_JUMP, SITE_INDIRECT_JUMP, SITE_JUMP,
        SITE_RET, SITE_URETPROBE, condition_holds, cookie_condition, cookie_go, cookie_jump_site,
        cookie_rule, cookie_site,
    },
    rule::{
        COUNTER_DEPTH_OVERFLOW, COUNTER_UNMATCHED_RETURN, COUNTER_UNWOUND, EntryFrame, EntryKey,
        FLAG_ON_ENTRY, FLAG_RUNNING, Frame, KIND_FUNCTION, MAX_CALL_DEPTH, RuleSpec, RunningFrame,
    },
    trigger::{PHASE_ENTRY, PHASE_RETURN},
};

use crate::{
    emit::{count, count_n, fire_rule, now_ns, record_for_current},
    maps::{
        EMPTY_ENTRY_STACK, EMPTY_RUNNING_STACK, ENTRY_TIMES, JUMP_SITES, RULES, RUNNING_TIMES,
        config, current_rules,
    },
};

#[uprobe]
pub fn function_entry(ctx: ProbeContext) -> u32 {
    let _ = try_function_entry(&ctx);
    0
}

/// At a `ret` or a jump out of the function (the cookie says which).
#[uprobe]
pub fn function_exit(ctx: ProbeContext) -> u32 {
    // SAFETY: the context pointer comes from the kernel for this program invocation.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let _ = try_function_exit(ctx.regs, cookie);
    0
}

/// An explicitly requested uretprobe (`return_probe: uretprobe`).
#[uretprobe]
pub fn function_return(ctx: RetProbeContext) -> u32 {
    // SAFETY: the context pointer comes from the kernel for this program invocation.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let _ = try_function_exit(ctx.regs, cookie);
    0
}

/// The rule a probe with `cookie` was attached for, if the current process is one of its
/// targets.
#[inline(always)]
fn rule_for(cookie: u64, pid_tgid: u64) -> Option<(u32, &'static RuleSpec)> {
    let rule_id = cookie_rule(cookie);
    if rule_id >= MAX_RULES {
        return None;
    }
    let mask = current_rules((pid_tgid >> 32) as u32, config()?);
    if mask & (1 << rule_id) == 0 {
        return None;
    }
    Some((rule_id, RULES.get(rule_id)?))
}

/// Whose calls these are and where the current frame sits, with the stack pointer `sp`
/// pointing at the return address. Go: `None` when R14 does not hold a goroutine whose
/// stack contains `sp` (system stack, cgo, foreign code): that call is not measured.
#[inline(always)]
fn frame_of(
    regs: &pt_regs,
    sp: u64,
    go: bool,
    pid_tgid: u64,
    rule_id: u32,
) -> Option<(EntryKey, u64)> {
    let tgid = (pid_tgid >> 32) as u32;
    if !go {
        let key = EntryKey {
            thread: pid_tgid & 0xffff_ffff,
            tgid,
            rule_id,
        };
        return Some((key, sp));
    }
    let g = regs.r14;
    // runtime.g starts with `stack struct { lo, hi uintptr }`.
    // SAFETY: the checked helper reads user memory or fails.
    let bounds = unsafe { bpf_probe_read_user(g as *const [u64; 2]) }.ok()?;
    let (lo, hi) = (bounds[0], bounds[1]);
    if g == 0 || sp < lo || sp >= hi {
        return None;
    }
    let key = EntryKey {
        thread: g,
        tgid,
        rule_id,
    };
    Some((key, sp.wrapping_sub(hi)))
}

/// Drops the frames of `frames[..depth]` at or below `height` (`inclusive`) or strictly
/// below it; returns how many.
#[inline(always)]
fn drop_below<F: Frame>(
    depth: &mut u64,
    frames: &[F; MAX_CALL_DEPTH],
    height: u64,
    inclusive: bool,
) -> u64 {
    let mut dropped = 0;
    for _ in 0..MAX_CALL_DEPTH {
        let d = *depth as usize;
        if d == 0 {
            break;
        }
        let Some(top) = frames.get((d - 1) & (MAX_CALL_DEPTH - 1)) else {
            break;
        };
        let (top, at) = (top.height().cast_signed(), height.cast_signed());
        if top < at || (inclusive && top == at) {
            *depth -= 1;
            dropped += 1;
        } else {
            break;
        }
    }
    dropped
}

fn try_function_entry(ctx: &ProbeContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: the context pointer comes from the kernel for this program invocation.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let (rule_id, rule) = rule_for(cookie, pid_tgid)?;
    // SAFETY: regs points at the probed task's saved registers.
    let regs = unsafe { &*ctx.regs };
    if rule.flags & FLAG_ON_ENTRY != 0 {
        let mut record = record_for_current(pid_tgid);
        record.phase = PHASE_ENTRY;
        record.ip = regs.rip;
        record.kind = KIND_FUNCTION;
        fire_rule(ctx.as_ptr(), rule_id, rule, record);
        return Some(());
    }
    let now = now_ns();
    let (key, height) = frame_of(regs, regs.rsp, cookie_go(cookie), pid_tgid, rule_id)?;
    if rule.flags & FLAG_RUNNING != 0 {
        return push_running(regs, cookie, key, height, now);
    }
    // SAFETY: map value pointer valid for this invocation; only this thread uses this key
    // (Go: only the thread running this goroutine).
    let stack = unsafe { &mut *stack_of(&ENTRY_TIMES, &EMPTY_ENTRY_STACK, key)? };
    let dropped = drop_below(&mut stack.depth, &stack.frames, height, true);
    if dropped != 0 {
        count_n(rule_id, COUNTER_UNWOUND, dropped);
    }
    let depth = stack.depth as usize;
    if depth >= MAX_CALL_DEPTH {
        count(rule_id, COUNTER_DEPTH_OVERFLOW);
        return Some(());
    }
    let slot = stack.frames.get_mut(depth & (MAX_CALL_DEPTH - 1))?;
    *slot = EntryFrame {
        height,
        entry_ns: now,
    };
    stack.depth += 1;
    Some(())
}

/// The per-thread stack of `key` in `map`, inserted from `empty`'s value 0 when it has
/// none (the empty stacks come from maps: 520 bytes and more do not fit the BPF stack).
#[inline(always)]
fn stack_of<V>(map: &LruHashMap<EntryKey, V>, empty: &Array<V>, key: EntryKey) -> Option<*mut V> {
    if let Some(stack) = map.get_ptr_mut(key) {
        return Some(stack);
    }
    // SAFETY: array map values are preallocated and never written.
    let empty = unsafe { &*empty.get_ptr(0)? };
    map.insert(key, empty, 0).ok()?;
    map.get_ptr_mut(key)
}

/// A `detect: running` entry: the frame goes to `RUNNING_TIMES` with what a later look is
/// checked against (the return address SP points at here, and the function's code, sized
/// by the cookie). Frames dropped here are calls that returned (no exit probe pops them):
/// not counted as abandoned.
#[inline(always)]
fn push_running(regs: &pt_regs, cookie: u64, key: EntryKey, height: u64, now: u64) -> Option<()> {
    // SAFETY: map value pointer valid for this invocation; only this thread uses this key.
    let stack = unsafe { &mut *stack_of(&RUNNING_TIMES, &EMPTY_RUNNING_STACK, key)? };
    stack.go = u64::from(cookie_go(cookie));
    drop_below(&mut stack.depth, &stack.frames, height, true);
    let depth = stack.depth as usize;
    if depth >= MAX_CALL_DEPTH {
        count(key.rule_id, COUNTER_DEPTH_OVERFLOW);
        return Some(());
    }
    let slot = stack.frames.get_mut(depth & (MAX_CALL_DEPTH - 1))?;
    *slot = RunningFrame {
        height,
        entry_ns: now,
        // SAFETY: the checked helper reads user memory or fails.
        return_address: unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0),
        func: regs.rip,
        func_end: regs.rip.wrapping_add(cookie_jump_site(cookie).into()),
    };
    stack.depth += 1;
    Some(())
}

/// The probed task's general registers and RIP in `JumpSite` numbering, copied out of the
/// context: the verifier refuses a load through a context pointer with a computed offset,
/// which is what a `match` on the register number compiles to.
#[inline(always)]
fn registers(regs: &pt_regs) -> [u64; 17] {
    [
        regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi, regs.r8,
        regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15, regs.rip,
    ]
}

/// Register `n` of `all` (see [`registers`]); `None` for [`REG_NONE`] and anything else
/// out of range.
#[inline(always)]
fn register(all: &[u64; 17], n: u8) -> Option<u64> {
    if n > REG_RIP {
        return None;
    }
    // An opaque index, bounded after the read, so the verifier sees the bound (as in
    // `bit_is_set` of lookback-common).
    let index = usize::from(n);
    // SAFETY: reading a local we own.
    let index = unsafe { core::ptr::read_volatile(&raw const index) };
    if index > 16 {
        return None;
    }
    Some(all[index])
}

/// Whether the indirect jump at the probe leaves the function: its target, computed as the
/// instruction would, is outside every code range of the function. `None` (not decided,
/// the call is then not measured at this site) when the target cannot be read.
#[inline(always)]
fn indirect_jump_leaves(regs: &pt_regs, index: u32) -> Option<bool> {
    let site = JUMP_SITES.get(index)?;
    let all = registers(regs);
    let mut address = site.disp.cast_unsigned();
    if site.base != REG_NONE {
        address = address.wrapping_add(register(&all, site.base)?);
    }
    if site.index != REG_NONE {
        address =
            address.wrapping_add(register(&all, site.index)?.wrapping_mul(u64::from(site.scale)));
    }
    let target = if site.memory != 0 {
        // SAFETY: the checked helper reads user memory or fails.
        unsafe { bpf_probe_read_user(address as *const u64) }.ok()?
    } else {
        address
    };
    let here = regs.rip;
    for i in 0..MAX_CODE_RANGES {
        if i >= usize::from(site.range_count) {
            break;
        }
        let range = site.ranges[i];
        let start = here.wrapping_add(range.start.cast_unsigned());
        let end = here.wrapping_add(range.end.cast_unsigned());
        if target >= start && target < end {
            return Some(false);
        }
    }
    Some(true)
}

fn try_function_exit(regs: *mut pt_regs, cookie: u64) -> Option<()> {
    let now = now_ns();
    let pid_tgid = bpf_get_current_pid_tgid();
    let (rule_id, rule) = rule_for(cookie, pid_tgid)?;
    if rule.flags & FLAG_ON_ENTRY != 0 {
        return Some(());
    }
    // SAFETY: regs points at the probed task's saved registers.
    let regs = unsafe { &*regs };
    let site = cookie_site(cookie);
    let leaves = match site {
        SITE_RET | SITE_JUMP | SITE_URETPROBE => true,
        SITE_COND_JUMP => condition_holds(cookie_condition(cookie), regs.eflags),
        SITE_INDIRECT_JUMP => indirect_jump_leaves(regs, cookie_jump_site(cookie))?,
        _ => false,
    };
    if !leaves {
        return Some(());
    }
    // Before a `ret` or a tail jump SP points at the return address, as at entry; after a
    // uretprobe's return it has been popped.
    let (sp, return_address) = if site == SITE_URETPROBE {
        (regs.rsp.wrapping_sub(8), regs.rip)
    } else {
        // SAFETY: the checked helper reads user memory or fails.
        let ra = unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0);
        (regs.rsp, ra)
    };
    let (key, height) = frame_of(regs, sp, cookie_go(cookie), pid_tgid, rule_id)?;
    let Some(stack) = ENTRY_TIMES.get_ptr_mut(key) else {
        count(rule_id, COUNTER_UNMATCHED_RETURN);
        return None;
    };
    // SAFETY: map value pointer valid for this invocation; only this thread uses this key.
    let stack = unsafe { &mut *stack };
    let dropped = drop_below(&mut stack.depth, &stack.frames, height, false);
    if dropped != 0 {
        count_n(rule_id, COUNTER_UNWOUND, dropped);
    }
    let depth = stack.depth as usize;
    let top = if depth == 0 {
        None
    } else {
        stack
            .frames
            .get((depth - 1) & (MAX_CALL_DEPTH - 1))
            .copied()
    };
    let Some(top) = top.filter(|f| f.height == height) else {
        count(rule_id, COUNTER_UNMATCHED_RETURN);
        return None;
    };
    stack.depth -= 1;
    let duration = now.saturating_sub(top.entry_ns);
    if duration < rule.min_duration_ns {
        return Some(());
    }
    let mut record = record_for_current(pid_tgid);
    record.timestamp_ns = now;
    record.phase = PHASE_RETURN;
    record.duration_ns = duration;
    // The return value is in RAX at a `ret`; a tail-called function has yet to compute it.
    record.ret = if site == SITE_RET || site == SITE_URETPROBE {
        regs.rax.cast_signed()
    } else {
        0
    };
    record.ip = return_address;
    record.depth = (depth - 1) as u32;
    // The context of a uprobe and of a uretprobe is the task's saved registers.
    record.kind = KIND_FUNCTION;
    fire_rule(
        core::ptr::from_ref(regs).cast_mut().cast(),
        rule_id,
        rule,
        record,
    );
    Some(())
}
