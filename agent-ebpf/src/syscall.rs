//! Syscall triggers on the `raw_syscalls` raw tracepoints (`sys_enter`/`sys_exit`). Rules without
//! a latency or errno condition fire on entry (an `exit_group` never returns); the others
//! remember the entry time per thread and decide on exit.
use aya_ebpf::{
    EbpfContext as _, helpers::bpf_get_current_pid_tgid, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use lookback_common::{
    MAX_RULES,
    rule::{FLAG_ERRNO, FLAG_ON_ENTRY, FLAG_RUNNING, KIND_SYSCALL, SyscallStart},
    trigger::{PHASE_ENTRY, PHASE_RETURN},
};

use crate::{
    emit::{Firing, fire, now_ns, record_for_current},
    maps::{RULES, SYSCALL_START, config, current_rules, rule_slots},
};

/// `TP_PROTO(struct pt_regs *regs, long id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_enter(&ctx);
    0
}

/// `TP_PROTO(struct pt_regs *regs, long ret)`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_exit(&ctx);
    0
}

fn try_sys_enter(ctx: &RawTracePointContext) -> Option<()> {
    let config = config()?;
    if config.syscall_rules == 0 {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let mask = current_rules((pid_tgid >> 32) as u32, config) & config.syscall_rules;
    if mask == 0 {
        return None;
    }
    let nr: u64 = ctx.arg(1);
    let now = now_ns();
    let mut wants_exit = false;
    let mut firing = Firing::default();
    let slots = rule_slots();
    for rule_id in 0..MAX_RULES {
        if rule_id >= slots || mask >> rule_id == 0 {
            break; // no rule with this id or above applies
        }
        if mask & (1 << rule_id) == 0 {
            continue;
        }
        let Some(rule) = RULES.get(rule_id) else {
            continue;
        };
        if !rule.has_syscall(nr) {
            continue;
        }
        if rule.flags & FLAG_ON_ENTRY != 0 {
            firing.add(rule_id, rule, now, (pid_tgid >> 32) as u32);
        } else {
            wants_exit = true;
        }
    }
    let mut record = record_for_current(pid_tgid);
    record.kind = KIND_SYSCALL;
    record.timestamp_ns = now;
    record.phase = PHASE_ENTRY;
    record.syscall_nr = nr as u32;
    fire(ctx.as_ptr(), firing, record, true);
    if wants_exit {
        let start = SyscallStart {
            enter_ns: now,
            nr,
            rules: mask,
            tgid: (pid_tgid >> 32) as u32,
            reserved: 0,
        };
        SYSCALL_START.insert(pid_tgid as u32, start, 0).ok()?;
    }
    Some(())
}

fn try_sys_exit(ctx: &RawTracePointContext) -> Option<()> {
    let config = config()?;
    if config.syscall_rules == 0 {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let mask = current_rules((pid_tgid >> 32) as u32, config) & config.syscall_rules;
    if mask == 0 {
        // No longer a target (exiting, retargeted, a rule removed): its start must still
        // go, or the in-flight scan would see a syscall that ended as running.
        if config.running_rules & config.syscall_rules != 0 {
            let _ = SYSCALL_START.remove(tid);
        }
        return None;
    }
    // SAFETY: plain-data value copied out before the entry is removed.
    let start = unsafe { SYSCALL_START.get(tid) }.copied()?;
    let _ = SYSCALL_START.remove(tid);
    let now = now_ns();
    let ret: i64 = ctx.arg(1);
    let duration = now.saturating_sub(start.enter_ns);
    let mut firing = Firing::default();
    let slots = rule_slots();
    for rule_id in 0..MAX_RULES {
        if rule_id >= slots || mask >> rule_id == 0 {
            break; // no rule with this id or above applies
        }
        if mask & (1 << rule_id) == 0 {
            continue;
        }
        let Some(rule) = RULES.get(rule_id) else {
            continue;
        };
        // `detect: running` rules are judged while the call runs (`inflight`), not here.
        if rule.flags & (FLAG_ON_ENTRY | FLAG_RUNNING) == 0
            && rule.has_syscall(start.nr)
            && duration >= rule.min_duration_ns
            && (rule.flags & FLAG_ERRNO == 0 || rule.errno_matches(ret))
        {
            firing.add(rule_id, rule, now, (pid_tgid >> 32) as u32);
        }
    }
    let mut record = record_for_current(pid_tgid);
    record.kind = KIND_SYSCALL;
    record.timestamp_ns = now;
    record.phase = PHASE_RETURN;
    record.syscall_nr = start.nr as u32;
    record.duration_ns = duration;
    record.ret = ret;
    fire(ctx.as_ptr(), firing, record, true);
    Some(())
}
