//! Follows forks: a child of a traced process inherits the rules that have
//! `FLAG_FOLLOW_FORKS`, in the kernel, before the child runs its first instruction.
//! `sched_process_fork`: `TP_PROTO(struct task_struct *parent, struct task_struct *child)`.
use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use aya_log_ebpf::debug;

use crate::maps::{TARGET_TGIDS, config, task_u32};

#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn process_fork(ctx: RawTracePointContext) -> i32 {
    let _ = try_process_fork(&ctx);
    0
}

fn try_process_fork(ctx: &RawTracePointContext) -> Option<()> {
    let config = config()?;
    if config.follow_fork_rules == 0 {
        return None;
    }
    let parent: *const u8 = ctx.arg(0);
    let child: *const u8 = ctx.arg(1);
    // Both tasks are live during the tracepoint.
    let parent_tgid = task_u32(parent, config.task_tgid_offset)?;
    let child_tgid = task_u32(child, config.task_tgid_offset)?;
    if parent_tgid == child_tgid {
        return None; // a new thread, already covered by its process
    }
    // SAFETY: plain u64 value.
    let mask = unsafe { TARGET_TGIDS.get(parent_tgid) }.copied()? & config.follow_fork_rules;
    if mask != 0 {
        TARGET_TGIDS.insert(child_tgid, mask, 0).ok()?;
        // Rare (forks of targets only): tell the agent through aya-log.
        debug!(ctx, "following fork {} -> {}", parent_tgid, child_tgid);
    }
    Some(())
}
