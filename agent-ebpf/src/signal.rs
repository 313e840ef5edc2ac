//! Signal triggers on the `signal_generate` raw tracepoint:
//! `TP_PROTO(int sig, struct kernel_siginfo *info, struct task_struct *task, int group,
//! int result)`. The receiving task's ids are read at the `task_struct` offsets the agent
//! found in the kernel's BTF (Rust eBPF has no CO-RE relocations).
use aya_ebpf::{
    EbpfContext as _, helpers::bpf_get_current_pid_tgid, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use lookback_common::{MAX_RULES, rule::KIND_SIGNAL, trigger::PHASE_ENTRY};

use crate::{
    emit::{Firing, fire, now_ns, record_for_current},
    maps::{RULES, TARGET_TGIDS, config, rule_slots, task_u32},
};

/// `TRACE_SIGNAL_DELIVERED` and `TRACE_SIGNAL_LOSE_INFO`: the signal reached the task.
const RESULT_DELIVERED: u64 = 0;
const RESULT_LOSE_INFO: u64 = 4;

#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> i32 {
    let _ = try_signal_generate(&ctx);
    0
}

fn try_signal_generate(ctx: &RawTracePointContext) -> Option<()> {
    let config = config()?;
    if config.signal_rules == 0 {
        return None;
    }
    let result: u64 = ctx.arg(4);
    if result != RESULT_DELIVERED && result != RESULT_LOSE_INFO {
        return None;
    }
    let task: *const u8 = ctx.arg(2);
    // `task` is a live task_struct for the duration of the tracepoint; the offsets come
    // from this kernel's BTF.
    let tgid = task_u32(task, config.task_tgid_offset)?;
    let thread = task_u32(task, config.task_pid_offset)?;
    // Cgroup targets are matched by the agent when it adds their tgids; the receiving task
    // is not the current one here, so its cgroup id cannot be read cheaply.
    // SAFETY: plain u64 value.
    let mask = unsafe { TARGET_TGIDS.get(tgid) }.copied().unwrap_or(0) & config.signal_rules;
    if mask == 0 {
        return None;
    }
    let sig: u64 = ctx.arg(0);
    let sender = bpf_get_current_pid_tgid();
    let mut firing = Firing::default();
    let now = now_ns();
    let slots = rule_slots();
    for rule_id in 0..MAX_RULES {
        if rule_id >= slots || mask >> rule_id == 0 {
            break; // no rule with this id or above applies
        }
        if mask & (1 << rule_id) == 0 {
            continue;
        }
        if let Some(rule) = RULES.get(rule_id)
            && rule.has_signal(sig)
        {
            firing.add(rule_id, rule, now, tgid);
        }
    }
    // The current thread is the receiver for a fault (SIGSEGV, SIGBUS) or a signal it
    // raised itself; otherwise it is the sender, whose stack says nothing of the target.
    let mut record = record_for_current(sender);
    record.timestamp_ns = now;
    record.kind = KIND_SIGNAL;
    record.pid = tgid;
    record.tid = thread;
    record.sender_pid = (sender >> 32) as u32;
    record.signal = sig as u32;
    record.phase = PHASE_ENTRY;
    fire(ctx.as_ptr(), firing, record, (sender >> 32) as u32 == tgid);
    Some(())
}
