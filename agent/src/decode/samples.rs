//! Decode, sampling half: the perf records of a sampling snapshot → per-thread stacks.
//!
//! In: a [`Snapshot`] whose rings hold perf records (`RingKind::PerfRecords`). Out:
//! [`ThreadSamples`] per (pid, tid), in time order, each stack outermost frame first: the
//! user frames, then the kernel's for a sample taken in the kernel (its kernel callchain
//! with `include_kernel`, else its kernel IP, which the writer names `[kernel]`). Caller
//! frames (return addresses) are moved back one byte so
//! they fall inside the call instruction; the leaf is the sampled IP. Thread names come
//! from `PERF_RECORD_COMM` records, else the process's comm. Never panics on record bytes:
//! malformed samples are counted and skipped.
//!
//! Samples of a process from before its last exec (`PERF_RECORD_COMM` with `COMM_EXEC`)
//! are dropped: they ran another program than the snapshot's maps describe (for `run`,
//! lookback's own child waiting to exec the command).
//!
//! A sample with user registers and a stack copy (`--stack-size`) is unwound by the
//! caller's [`Unwind`] (the `unwind` stage, which reads the snapshot's files: this stage
//! reads only the snapshot); one without them uses the kernel's callchain.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::capture::RingKind;
use crate::capture::records::{
    self, PERF_RECORD_COMM, PERF_RECORD_LOST, PERF_RECORD_LOST_SAMPLES, PERF_RECORD_MISC_COMM_EXEC,
    PERF_RECORD_MISC_SWITCH_OUT, PERF_RECORD_MISC_SWITCH_OUT_PREEMPT, PERF_RECORD_SAMPLE,
    PERF_RECORD_SWITCH, PERF_RECORD_SWITCH_CPU_WIDE, UserRegs,
};
use crate::snapshot::Snapshot;
use crate::sys::is_kernel_address;

/// One sampled stack of a thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackAt {
    pub time_ns: u64,
    /// Outermost frame first.
    pub addrs: Vec<u64>,
    /// The thread left the CPU here (a context-switch sample): until when.
    pub off_cpu: Option<OffCpu>,
}

/// A period a thread spent off the CPU, from its switch-out sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpu {
    /// When it ran again: its switch-in record, else its next sample, else the end of
    /// the recording.
    pub until_ns: u64,
    /// Switched out while runnable (preempted), not blocked.
    pub preempted: bool,
}

/// The samples of one thread.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ThreadSamples {
    pub pid: u32,
    pub tid: u32,
    /// From a COMM record, when the snapshot has one for this thread.
    pub comm: Option<String>,
    pub stacks: Vec<StackAt>,
    /// Times it came back on a CPU (`PERF_RECORD_SWITCH` in), sorted.
    switches_in: Vec<u64>,
    /// Times it left one while runnable (`PERF_RECORD_SWITCH` out, preempted), sorted.
    preemptions: Vec<u64>,
}

/// Samples the kernel reported lost (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`), with
/// the thread and time of the record when it carries them (`sample_id_all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    pub thread: Option<(u32, u32)>,
    pub time_ns: Option<u64>,
    pub count: u64,
}

/// All threads' samples and what could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sampled {
    pub threads: BTreeMap<(u32, u32), ThreadSamples>,
    /// Sample records that could not be parsed or had no pid/tid/time.
    pub malformed: u64,
    pub losses: Vec<Loss>,
}

/// The loss a LOST (id, lost) or `LOST_SAMPLES` (lost) record reports.
fn loss(kind: u32, body: &[u8], sample_type: u64, id_all: bool) -> Option<Loss> {
    let at = if kind == PERF_RECORD_LOST { 8 } else { 0 };
    let count = u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?);
    let (thread, time_ns) = if id_all {
        records::id_trailer(sample_type, body).unwrap_or((None, None))
    } else {
        (None, None)
    };
    Some(Loss {
        thread,
        time_ns,
        count,
    })
}

/// Unwinds a sample's copied user stack: (pid, registers, stack bytes from SP) → the
/// stack's addresses leaf first (the IP, then return addresses).
pub type Unwind<'u> = dyn FnMut(u32, UserRegs, &[u8]) -> Vec<u64> + 'u;

/// Whether address `addr` of process `pid` is inside a named function.
pub type Named<'n> = dyn FnMut(u32, u64) -> bool + 'n;

/// The user stack of `sample` (whose record body is `body`), outermost first, return
/// addresses moved into their call: unwound from the stack copy when it has one.
fn user_stack(sample: &records::Sample, body: &[u8], unwind: &mut Unwind<'_>) -> Vec<u64> {
    if let (Some(regs), Some(pid), Some(stack)) = (
        sample.user_regs,
        sample.pid,
        sample.user_stack.clone().and_then(|r| body.get(r)),
    ) {
        return outermost_first(unwind(pid, regs, stack));
    }
    callchain_stack(sample)
}

/// Moves the user leaf of a sample taken in the kernel back by one byte when only that
/// lands in a function. The user IP of such a sample is where the thread entered the
/// kernel; after a trap that is the byte *after* the trapping instruction, and a uprobe's
/// `int3` on a function's final `ret` (where the exit probes of a latency rule sit) puts
/// it past the function's end: named `[unknown]`, it split the slow call's slice at its
/// own exit probe (found by the off-CPU test under load). A fault at a function's first
/// byte (the IP is the faulting instruction, inside it) is left alone.
fn trap_leaf(sample: &records::Sample, stack: &mut [u64], named: &mut Named<'_>) {
    let (Some(pid), Some(leaf)) = (sample.pid, stack.last_mut()) else {
        return;
    };
    if sample.ip.is_some_and(is_kernel_address)
        && *leaf > 0
        && !named(pid, *leaf)
        && named(pid, *leaf - 1)
    {
        *leaf -= 1;
    }
}

/// The kernel frames of `sample`, outermost first, to go above its user stack: its
/// kernel callchain (`include_kernel`), else its IP when that is in the kernel (a thread
/// running a syscall: one `[kernel]` frame); none for a sample in user space.
fn kernel_stack(sample: &records::Sample) -> Vec<u64> {
    let mut leaf_first: Vec<u64> = sample.kernel_callchain().collect();
    if leaf_first.is_empty() {
        leaf_first.extend(sample.ip.filter(|&ip| is_kernel_address(ip)));
    }
    outermost_first(leaf_first)
}

/// The user stack of `sample` from its callchain, outermost first.
fn callchain_stack(sample: &records::Sample) -> Vec<u64> {
    let mut leaf_first: Vec<u64> = sample.user_callchain().collect();
    if leaf_first.is_empty() {
        // No callchain (or a kernel-only one): the IP alone, when it is a user address.
        leaf_first.extend(
            sample
                .ip
                .filter(|&ip| sample.callchain.is_empty() && ip < 1 << 63),
        );
    }
    outermost_first(leaf_first)
}

/// A callchain (leaf first: the IP, then return addresses) outermost first, each return
/// address moved back into its call instruction (it points after it, maybe into the next
/// function or line).
fn outermost_first(mut leaf_first: Vec<u64>) -> Vec<u64> {
    for caller in leaf_first.iter_mut().skip(1) {
        *caller = caller.saturating_sub(1);
    }
    leaf_first.reverse();
    leaf_first
}

/// Reads every sample of `snap`'s perf-record rings, stack copies unwound by `unwind`.
pub fn read_with(snap: &Snapshot, unwind: &mut Unwind<'_>) -> Sampled {
    read_named(snap, unwind, &mut |_, _| true)
}

/// [`read_with`], with `named` telling which addresses are in a named function (a trapped
/// user leaf past a function's end is moved back into it: [`trap_leaf`]).
pub fn read_named(snap: &Snapshot, unwind: &mut Unwind<'_>, named: &mut Named<'_>) -> Sampled {
    let layout = snap.meta.recorder.sample_layout();
    let sample_type = layout.sample_type;
    let switch_ids = &snap.meta.recorder.switch_ids;
    let id_all = snap.meta.recorder.sample_id_all;
    let mut out = Sampled::default();
    let mut comms = BTreeMap::new();
    // pid → its latest exec: what came before ran another program than the maps show.
    let mut execs: BTreeMap<u32, u64> = BTreeMap::new();
    let streams = snap
        .rings
        .iter()
        .filter(|r| r.kind == RingKind::PerfRecords)
        .map(|r| r.data.as_slice())
        .chain(snap.sideband.iter().map(|s| s.data.as_slice()));
    for stream in streams {
        for record in records::records(stream) {
            match record.kind {
                PERF_RECORD_SAMPLE => {
                    let Some(s) = records::parse_sample(layout, record.body) else {
                        out.malformed += 1;
                        continue;
                    };
                    let (Some(pid), Some(tid), Some(time_ns)) = (s.pid, s.tid, s.time) else {
                        out.malformed += 1;
                        continue;
                    };
                    let switch_out = s.id.is_some_and(|id| switch_ids.contains(&id));
                    let mut addrs = user_stack(&s, record.body, unwind);
                    trap_leaf(&s, &mut addrs, named);
                    if !switch_out {
                        // At a switch the kernel frames are the scheduler's: the
                        // `[off-cpu]` slice says that.
                        addrs.extend(kernel_stack(&s));
                    }
                    let thread = thread_of(&mut out, pid, tid);
                    thread.stacks.push(StackAt {
                        time_ns,
                        addrs,
                        off_cpu: switch_out.then_some(OffCpu {
                            until_ns: u64::MAX,
                            preempted: false,
                        }),
                    });
                }
                PERF_RECORD_SWITCH | PERF_RECORD_SWITCH_CPU_WIDE if id_all => {
                    let Some((Some((pid, tid)), Some(time))) =
                        records::id_trailer(sample_type, record.body)
                    else {
                        continue;
                    };
                    let thread = thread_of(&mut out, pid, tid);
                    if record.misc & PERF_RECORD_MISC_SWITCH_OUT == 0 {
                        thread.switches_in.push(time);
                    } else if record.misc & PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0 {
                        thread.preemptions.push(time);
                    }
                }
                PERF_RECORD_LOST | PERF_RECORD_LOST_SAMPLES => {
                    out.losses
                        .extend(loss(record.kind, record.body, sample_type, id_all));
                }
                PERF_RECORD_COMM => {
                    if let Some((pid, tid, name)) = records::comm_record(record.body) {
                        comms.insert((pid, tid), name);
                        let exec_time = (record.misc & PERF_RECORD_MISC_COMM_EXEC != 0 && id_all)
                            .then(|| records::id_trailer(sample_type, record.body))
                            .flatten()
                            .and_then(|(_, time)| time);
                        if let Some(time) = exec_time {
                            let latest = execs.entry(pid).or_insert(time);
                            *latest = (*latest).max(time);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    add_trigger_stack(snap, &mut out);
    let end = snap.meta.window_end_ns.unwrap_or(snap.meta.freeze_time_ns);
    finish_threads(&mut out, &mut comms, &execs, end);
    out.threads.retain(|_, t| !t.stacks.is_empty());
    out
}

/// The stack the kernel took at the trigger is one more sample of its thread, at the
/// trigger instant: a syscall's or signal's caller is open there even when no sample
/// caught it (with the kernel's frames above it, where the snapshot kept them).
fn add_trigger_stack(snap: &Snapshot, out: &mut Sampled) {
    if let Some(t) = snap
        .meta
        .trigger
        .as_ref()
        .filter(|t| t.pid != 0 && !t.stack.is_empty())
    {
        thread_of(out, t.pid, t.tid).stacks.push(StackAt {
            time_ns: t.trigger_time_ns,
            addrs: t
                .lookup_stack()
                .into_iter()
                .rev()
                .map(|(_, at)| at)
                .collect(),
            off_cpu: None,
        });
    }
}

/// Per thread: drops what came before its process's last exec, sorts, names it (COMM
/// records), closes its off-CPU periods (the recording ends at `end`).
fn finish_threads(
    out: &mut Sampled,
    comms: &mut BTreeMap<(u32, u32), String>,
    execs: &BTreeMap<u32, u64>,
    end: u64,
) {
    for (key, thread) in &mut out.threads {
        if let Some(&exec) = execs.get(&thread.pid) {
            thread.stacks.retain(|s| s.time_ns >= exec);
            thread.switches_in.retain(|&t| t >= exec);
        }
        thread.stacks.sort_by_key(|s| s.time_ns);
        thread.switches_in.sort_unstable();
        thread.preemptions.sort_unstable();
        thread.comm = comms.remove(key);
        close_off_cpu(thread, end);
    }
}

/// The thread `(pid, tid)` of `out`, added when new.
fn thread_of(out: &mut Sampled, pid: u32, tid: u32) -> &mut ThreadSamples {
    out.threads
        .entry((pid, tid))
        .or_insert_with(|| ThreadSamples {
            pid,
            tid,
            ..ThreadSamples::default()
        })
}

/// How long after a switch-out sample its `PERF_RECORD_SWITCH` may come (both are written
/// in the same pass through the scheduler).
const SWITCH_RECORD_SLACK_NS: u64 = 50_000;

/// Ends each off-CPU period of `thread` at its first switch in after it, else at its
/// next sample, else at `end`; marks the ones whose switch out was a preemption.
fn close_off_cpu(thread: &mut ThreadSamples, end: u64) {
    let times: Vec<u64> = thread.stacks.iter().map(|s| s.time_ns).collect();
    for (i, stack) in thread.stacks.iter_mut().enumerate() {
        let Some(off) = stack.off_cpu.as_mut() else {
            continue;
        };
        let t = stack.time_ns;
        let switch_in = thread
            .switches_in
            .get(thread.switches_in.partition_point(|&s| s < t))
            .copied();
        let next_sample = times
            .get(i + 1..)
            .and_then(|rest| rest.iter().find(|&&n| n > t));
        off.until_ns = switch_in.or(next_sample.copied()).unwrap_or(end).max(t);
        let p = thread.preemptions.partition_point(|&s| s < t);
        off.preempted = thread
            .preemptions
            .get(p)
            .is_some_and(|&s| s - t <= SWITCH_RECORD_SLACK_NS);
    }
}

#[cfg(test)]
mod tests {
    use super::{Loss, callchain_stack, kernel_stack, loss, trap_leaf, user_stack};
    use crate::capture::records::{
        PERF_CONTEXT_KERNEL, PERF_CONTEXT_USER, PERF_RECORD_LOST, PERF_RECORD_LOST_SAMPLES,
        SAMPLE_TID, SAMPLE_TIME, Sample, UserRegs, comm_record,
    };

    #[test]
    fn lost_records_say_how_many_and_where() {
        let mut body = Vec::new();
        body.extend(9u64.to_le_bytes()); // id
        body.extend(5u64.to_le_bytes()); // lost
        body.extend((7u64 << 32 | 3).to_le_bytes()); // pid 3, tid 7
        body.extend(1234u64.to_le_bytes()); // time
        let st = SAMPLE_TID | SAMPLE_TIME;
        assert_eq!(
            loss(PERF_RECORD_LOST, &body, st, true),
            Some(Loss {
                thread: Some((3, 7)),
                time_ns: Some(1234),
                count: 5
            })
        );
        assert_eq!(
            loss(PERF_RECORD_LOST_SAMPLES, &body[8..], st, false).map(|l| l.count),
            Some(5)
        );
        assert_eq!(loss(PERF_RECORD_LOST, &body[..12], st, true), None);
    }

    #[test]
    fn user_stacks_are_outermost_first_with_callers_moved_into_the_call() {
        let s = Sample {
            ip: Some(0x1010),
            callchain: vec![PERF_CONTEXT_USER, 0x1010, 0x2005, 0x3005],
            ..Sample::default()
        };
        assert_eq!(callchain_stack(&s), [0x3004, 0x2004, 0x1010]);
    }

    #[test]
    fn the_user_leaf_of_a_sample_in_the_kernel_is_moved_back_into_its_function() {
        // A function at 0x1300..0x133a (its `ret` at 0x1339), another from 0x1340.
        let mut named = |_: u32, addr: u64| (0x1300..0x133a).contains(&addr) || addr >= 0x1340;
        let trapped = Sample {
            ip: Some(0xffff_ffff_8100_0000),
            pid: Some(9),
            ..Sample::default()
        };
        // In a uprobe's int3 on the `ret`: the user IP is 0x133a, past the function.
        let mut stack = [0x2004, 0x133a];
        trap_leaf(&trapped, &mut stack, &mut named);
        assert_eq!(stack, [0x2004, 0x1339]);
        // A fault at a function's first byte: the IP is in it, and stays.
        let mut stack = [0x2004, 0x1340];
        trap_leaf(&trapped, &mut stack, &mut named);
        assert_eq!(stack, [0x2004, 0x1340]);
        // A sample in user space keeps its IP.
        let in_user = Sample {
            ip: Some(0x133a),
            ..trapped.clone()
        };
        let mut stack = [0x2004, 0x133a];
        trap_leaf(&in_user, &mut stack, &mut named);
        assert_eq!(stack, [0x2004, 0x133a]);
    }

    #[test]
    fn a_stack_copy_is_unwound_and_its_return_addresses_moved_into_the_call() {
        let s = Sample {
            pid: Some(9),
            user_regs: Some(UserRegs {
                ip: 0x1010,
                sp: 0x7000,
                bp: 0,
            }),
            user_stack: Some(2..6),
            ..Sample::default()
        };
        let body = [0, 0, 1, 2, 3, 4, 0];
        let mut seen = Vec::new();
        let stack = user_stack(&s, &body, &mut |pid, regs, bytes: &[u8]| {
            seen.push((pid, regs.sp, bytes.to_vec()));
            vec![regs.ip, 0x2005]
        });
        assert_eq!(stack, [0x2004, 0x1010]);
        assert_eq!(seen, [(9, 0x7000, vec![1, 2, 3, 4])]);
        // A stack range outside the body: the callchain (here none: the IP).
        let bad = Sample {
            ip: Some(0x1010),
            user_stack: Some(2..60),
            ..s
        };
        let stack = user_stack(&bad, &body, &mut |_, _, _| panic!("not unwound"));
        assert_eq!(stack, [0x1010]);
    }

    #[test]
    fn kernel_frames_go_above_the_user_stack() {
        let k = 0xffff_ffff_8100_0000u64;
        let s = Sample {
            ip: Some(k + 0x10),
            callchain: vec![
                PERF_CONTEXT_KERNEL,
                k + 0x10,
                k + 0x205,
                PERF_CONTEXT_USER,
                0x1005,
            ],
            ..Sample::default()
        };
        assert_eq!(kernel_stack(&s), [k + 0x204, k + 0x10]);
        // Without a kernel callchain: the kernel IP alone; a user IP: nothing.
        let bare = Sample {
            ip: Some(k + 0x10),
            ..Sample::default()
        };
        assert_eq!(kernel_stack(&bare), [k + 0x10]);
        let user = Sample {
            ip: Some(0x1010),
            ..Sample::default()
        };
        assert!(kernel_stack(&user).is_empty());
    }

    #[test]
    fn without_a_callchain_the_ip_is_the_stack() {
        let s = Sample {
            ip: Some(0x1010),
            ..Sample::default()
        };
        assert_eq!(callchain_stack(&s), [0x1010]);
    }

    #[test]
    fn comm_records_parse_and_short_ones_do_not() {
        let mut body = Vec::new();
        body.extend(7u32.to_le_bytes());
        body.extend(8u32.to_le_bytes());
        body.extend(b"worker\0\0");
        assert_eq!(comm_record(&body), Some((7, 8, "worker".to_owned())));
        assert_eq!(comm_record(&body[..6]), None);
    }
}
