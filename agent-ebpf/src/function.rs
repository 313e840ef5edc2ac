//! Function triggers: a uprobe on entry and a uretprobe on return of one symbol, attached
//! with the rule id as the BPF cookie (kernel ≥ 5.15). Entry-only rules fire on entry;
//! latency rules keep a per-thread stack of entry times so recursion and concurrent
//! threads are each measured against their own entry.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use lookback_common::{
    MAX_RULES,
    rule::{
        COUNTER_DEPTH_OVERFLOW, COUNTER_UNMATCHED_RETURN, EntryStack, FLAG_ON_ENTRY,
        MAX_CALL_DEPTH, RuleSpec,
    },
    trigger::{PHASE_ENTRY, PHASE_RETURN},
};

use crate::{
    emit::{count, fire, now_ns, record_for_current},
    maps::{ENTRY_TIMES, RULES, config, current_rules},
};

#[uprobe]
pub fn function_entry(ctx: ProbeContext) -> u32 {
    let _ = try_function_entry(&ctx);
    0
}

#[uretprobe]
pub fn function_return(ctx: RetProbeContext) -> u32 {
    let _ = try_function_return(&ctx);
    0
}

/// The rule this probe was attached for, if the current process is one of its targets.
#[inline(always)]
fn rule_for(ctx_ptr: *mut core::ffi::c_void, pid_tgid: u64) -> Option<(u32, &'static RuleSpec)> {
    // SAFETY: the context pointer comes from the kernel for this program invocation.
    let cookie = unsafe { bpf_get_attach_cookie(ctx_ptr) };
    let rule_id = u32::try_from(cookie).ok().filter(|id| *id < MAX_RULES)?;
    let mask = current_rules((pid_tgid >> 32) as u32, config()?);
    if mask & (1 << rule_id) == 0 {
        return None;
    }
    Some((rule_id, RULES.get(rule_id)?))
}

fn try_function_entry(ctx: &ProbeContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (rule_id, rule) = rule_for(ctx.as_ptr(), pid_tgid)?;
    let key = (u64::from(rule_id) << 32) | (pid_tgid & 0xffff_ffff);
    if rule.flags & FLAG_ON_ENTRY != 0 {
        let mut record = record_for_current(pid_tgid);
        record.phase = PHASE_ENTRY;
        // SAFETY: regs points at the probed task's saved registers.
        record.ip = unsafe { (*ctx.regs).rip };
        record.depth = ENTRY_TIMES
            .get_ptr(key)
            // SAFETY: map value pointer valid for this invocation.
            .map_or(0, |s| unsafe { (*s).depth } as u32);
        fire(rule_id, rule, record);
        return Some(());
    }
    let now = now_ns();
    let stack = match ENTRY_TIMES.get_ptr_mut(key) {
        Some(stack) => stack,
        None => {
            let fresh = EntryStack {
                depth: 0,
                entry_ns: [0; MAX_CALL_DEPTH],
            };
            ENTRY_TIMES.insert(key, fresh, 0).ok()?;
            ENTRY_TIMES.get_ptr_mut(key)?
        }
    };
    // SAFETY: map value pointer valid for this invocation; only this thread uses this key.
    let stack = unsafe { &mut *stack };
    let depth = stack.depth as usize;
    if let Some(slot) = stack.entry_ns.get_mut(depth) {
        *slot = now;
    } else {
        count(rule_id, COUNTER_DEPTH_OVERFLOW);
    }
    stack.depth += 1;
    Some(())
}

fn try_function_return(ctx: &RetProbeContext) -> Option<()> {
    let now = now_ns();
    let pid_tgid = bpf_get_current_pid_tgid();
    let (rule_id, rule) = rule_for(ctx.as_ptr(), pid_tgid)?;
    if rule.flags & FLAG_ON_ENTRY != 0 {
        return Some(());
    }
    let key = (u64::from(rule_id) << 32) | (pid_tgid & 0xffff_ffff);
    let Some(stack) = ENTRY_TIMES.get_ptr_mut(key) else {
        count(rule_id, COUNTER_UNMATCHED_RETURN);
        return None;
    };
    // SAFETY: map value pointer valid for this invocation; only this thread uses this key.
    let stack = unsafe { &mut *stack };
    if stack.depth == 0 {
        count(rule_id, COUNTER_UNMATCHED_RETURN);
        return None;
    }
    stack.depth -= 1;
    let depth = stack.depth as usize;
    // Deeper than the stack: that call's entry was not timed.
    let entered = *stack.entry_ns.get(depth)?;
    let duration = now.saturating_sub(entered);
    if duration < rule.min_duration_ns {
        return Some(());
    }
    let mut record = record_for_current(pid_tgid);
    record.timestamp_ns = now;
    record.phase = PHASE_RETURN;
    record.duration_ns = duration;
    record.ret = ctx.ret::<i64>();
    // SAFETY: regs points at the probed task's saved registers (ip = return address).
    record.ip = unsafe { (*ctx.regs).rip };
    record.depth = depth as u32;
    fire(rule_id, rule, record);
    Some(())
}
