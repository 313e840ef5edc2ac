//! Follows forks: a child of a traced process inherits the rules that have
//! `FLAG_FOLLOW_FORKS`, in the kernel, before the child runs its first instruction.
//! `sched_process_fork`: `TP_PROTO(struct task_struct *parent, struct task_struct *child)`.
//!
//! For the agent, also reports execs (`sched_process_exec`: `TP_PROTO(struct task_struct *p,
//! pid_t old_pid, struct linux_binprm *bprm)`) so that processes started later are matched
//! against the rules, and exits of traced processes (`sched_process_exit`: `TP_PROTO(struct
//! task_struct *p)`), whose target entry is removed here so that a reused pid never
//! inherits rules.
use aya_ebpf::{
    helpers::bpf_get_current_comm, macros::raw_tracepoint, programs::RawTracePointContext,
};
use aya_log_ebpf::debug;
use lookback_common::process::{
    EXEC_SELECTED_ALL, EXEC_SELECTED_LOST, PROC_EXEC, PROC_EXIT, ProcessRecord,
};

use crate::{
    emit::now_ns,
    maps::{
        EXEC_COMMS, EXEC_SELECTED, FROZEN, PROC_EVENTS, PROC_EVENTS_LOST, TARGET_SET_FULL,
        TARGET_TGIDS, config, task_u32,
    },
};

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
        if TARGET_TGIDS.insert(child_tgid, mask, 0).is_err() {
            count_full();
            return None;
        }
        // Rare (forks of targets only): tell the agent through aya-log.
        debug!(ctx, "following fork {} -> {}", parent_tgid, child_tgid);
    }
    Some(())
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> i32 {
    let _ = try_process_exec(&ctx);
    0
}

fn try_process_exec(ctx: &RawTracePointContext) -> Option<()> {
    let config = config()?;
    if config.process_events == 0 {
        return None;
    }
    let task: *const u8 = ctx.arg(0);
    let tgid = task_u32(task, config.task_tgid_offset)?;
    let mut selected = 0;
    if let Ok(comm) = bpf_get_current_comm() {
        // SAFETY: plain u64 value.
        if let Some(&mask) = unsafe { EXEC_COMMS.get(comm) } {
            // SAFETY: as above.
            let had = unsafe { TARGET_TGIDS.get(tgid) }.copied().unwrap_or(0);
            if TARGET_TGIDS.insert(tgid, mask | had, 0).is_ok() {
                selected = mask;
                count_selected(EXEC_SELECTED_ALL);
            } else {
                count_full();
            }
        }
    }
    if !send(PROC_EXEC, tgid, selected) && selected != 0 {
        count_selected(EXEC_SELECTED_LOST);
    }
    Some(())
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> i32 {
    let _ = try_process_exit(&ctx);
    0
}

fn try_process_exit(ctx: &RawTracePointContext) -> Option<()> {
    let config = config()?;
    if config.process_events == 0 {
        return None;
    }
    let task: *const u8 = ctx.arg(0);
    let tgid = task_u32(task, config.task_tgid_offset)?;
    let pid = task_u32(task, config.task_pid_offset)?;
    if pid != tgid {
        return None; // a thread; the process lives on
    }
    // A reused pid must not start frozen.
    let _ = FROZEN.remove(tgid);
    // SAFETY: plain u64 value, only tested for presence.
    unsafe { TARGET_TGIDS.get(tgid) }?;
    let _ = TARGET_TGIDS.remove(tgid);
    send(PROC_EXIT, tgid, 0);
    Some(())
}

/// Sends one process record; a full ring drops it, counted (the agent's periodic rescan
/// catches up). Returns whether the record went into the ring.
#[inline(always)]
fn send(kind: u32, tgid: u32, selected: u64) -> bool {
    if let Some(mut entry) = PROC_EVENTS.reserve::<ProcessRecord>(0) {
        entry.write(ProcessRecord {
            timestamp_ns: now_ns(),
            kind,
            tgid,
            selected,
        });
        entry.submit(0);
        true
    } else {
        if let Some(lost) = PROC_EVENTS_LOST.get_ptr_mut(0) {
            // SAFETY: this CPU's slot (programs do not migrate while running).
            unsafe { *lost += 1 };
        }
        false
    }
}

/// Adds one to this CPU's `EXEC_SELECTED` slot `index`.
#[inline(always)]
fn count_selected(index: u32) {
    if let Some(slot) = EXEC_SELECTED.get_ptr_mut(index) {
        // SAFETY: this CPU's slot (programs do not migrate while running).
        unsafe { *slot += 1 };
    }
}

/// Counts a process left out of the target set because the set is full.
#[inline(always)]
fn count_full() {
    if let Some(slot) = TARGET_SET_FULL.get_ptr_mut(0) {
        // SAFETY: this CPU's slot (programs do not migrate while running).
        unsafe { *slot += 1 };
    }
}
