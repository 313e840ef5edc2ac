//! One scan of the calls in flight: candidates from the kernel's maps, looks at their
//! threads, the proof, and the fire (see the module above).

use std::{
    collections::{HashMap, HashSet},
    io::Read as _,
    os::fd::{AsFd as _, OwnedFd},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use lookback_common::rule::{
    INFLIGHT_ARGS, INFLIGHT_FUNCTION, INFLIGHT_SENT, INFLIGHT_SUPPRESSED, INFLIGHT_SYSCALL,
    KIND_FUNCTION, KIND_SYSCALL, MAX_LOOKS, RuleSpec, RunningFrame,
};

use super::{
    Stats,
    goroutine::{self, GoStack},
    proof::{self, Proof},
    ticks::{TICK_NS, Ticks},
};
use crate::{
    capture::{ProcessMaps, procmaps},
    sys::{self, bpf},
    triggers::{
        event::{StackCopy, UserRegs},
        inflight::{Handles, stacks},
    },
    unwind::{StackUnwinder, UnwindFiles},
};

/// `exit` and `exit_group`: they never return, and the thread is gone after them.
const NEVER_RETURN: [u64; 2] = [libc::SYS_exit as u64, libc::SYS_exit_group as u64];

/// Looks at a call that could not be unwound to its height before it is given up
/// (`unproven`): a torn or early look gets another chance.
const UNPROVEN_TRIES: u8 = 3;

/// Threads of one Go process looked at in a scan at most (its goroutine may be on any).
const MAX_GO_THREADS: usize = 32;

/// A function call that has run past its threshold, not yet decided.
struct FunctionCall {
    /// A thread id, or in Go the goroutine (`g`).
    thread: u64,
    tgid: u32,
    rule_id: u32,
    min_ns: u64,
    /// Its height relative to the goroutine stack's top (see `RunningStack::go`).
    go: bool,
    frame: RunningFrame,
}

/// A syscall that has run past a running rule's threshold.
struct Syscall {
    tid: u32,
    tgid: u32,
    entry_ns: u64,
    /// The running syscall rules it met (fired one by one).
    rules: Vec<u32>,
}

/// A look the scan asked for: its slot in `LOOKS`, and when it asked.
#[derive(Clone, Copy)]
struct Wanted {
    slot: u32,
    since_ns: u64,
}

/// A look taken.
struct Taken {
    look_ns: u64,
    copy: StackCopy,
    /// The goroutine the thread may have been running (see `Look::g`).
    go: GoStack,
}

/// What `inflight_fire` did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fired {
    Sent,
    /// Met, and held back by the cooldown or the hourly limit.
    Suppressed,
    /// Not met (any more): the call ended, or its process is no target now.
    NotMet,
}

pub(super) struct Scanner {
    handles: Handles,
    stats: Arc<Stats>,
    /// Calls decided (fired, suppressed, shown ended, given up), by (thread, entry time);
    /// kept while they are in the kernel's maps.
    decided: HashSet<(u64, u64)>,
    /// Unproven looks per call so far.
    unproven: HashMap<(u64, u64), u8>,
    wanted: HashMap<u32, Wanted>,
    link: Option<OwnedFd>,
    /// The iterator could not be linked (logged once).
    no_iterator: bool,
    unwind: UnwindCache,
    ticks: Ticks,
}

impl Scanner {
    pub(super) fn new(handles: Handles, stats: Arc<Stats>) -> Self {
        let ticks = Ticks::open(handles.tick.as_fd());
        Self {
            ticks,
            handles,
            stats,
            decided: HashSet::new(),
            unproven: HashMap::new(),
            wanted: HashMap::new(),
            link: None,
            no_iterator: false,
            unwind: UnwindCache::default(),
        }
    }

    /// One pass. A kernel map that cannot be read ends it (the next pass tries again).
    pub(super) fn scan(&mut self) {
        let config = match self.handles.config.get(&0, 0) {
            Ok(config) => config,
            Err(e) => {
                log::debug!("in-flight scan: reading CONFIG: {e}");
                return;
            }
        };
        if config.running_rules == 0 {
            self.idle();
            return;
        }
        let rules = self.running_rules(config.running_rules);
        let now = sys::monotonic_ns();
        let mut present = HashSet::new();
        let calls = self.function_calls(&rules, now, &mut present);
        let syscalls = self.syscalls(&rules, config.syscall_rules, now, &mut present);
        // Decisions are kept while their calls are in the maps, and only then.
        self.decided.retain(|k| present.contains(k));
        self.unproven.retain(|k, _| present.contains(k));
        // A goroutine may be on any thread of its process.
        let go_threads: HashMap<u32, Vec<u32>> = calls
            .iter()
            .filter(|c| c.go)
            .map(|c| (c.tgid, threads_of(c.tgid)))
            .collect();
        let tids: HashSet<u32> = calls
            .iter()
            .filter(|c| !c.go)
            .map(|c| thread_tid(c.thread))
            .chain(go_threads.values().flatten().copied())
            .chain(syscalls.iter().map(|s| s.tid))
            .collect();
        self.want(&tids, now);
        if !self.wanted.is_empty() {
            self.run_iterator();
        }
        // What the iterator could not look at is running: the CPU ticks look at it.
        let on_cpu = self.wanted.iter().any(|(tid, w)| {
            self.handles
                .want_look
                .get(tid, 0)
                .is_ok_and(|s| s == w.slot)
        });
        self.ticks.set(on_cpu);
        if on_cpu {
            // A tick comes within TICK_NS: judged in this scan, the look is fresh when the
            // call fires (and the recorder freezes).
            std::thread::sleep(Duration::from_nanos(TICK_NS + 1_000_000));
        }
        // Syscalls first: they need no unwind, and fire at once.
        let mut looks: HashMap<u32, Option<Taken>> = HashMap::new();
        for call in syscalls {
            let look = self.taken(call.tid);
            self.fire_syscall(&call, look.as_ref());
            looks.insert(call.tid, look);
        }
        // One look per thread judges all its calls (recursion: several frames). A thread
        // whose look was taken is asked again next scan if it still has a candidate.
        for call in calls {
            if call.go {
                let threads = go_threads.get(&call.tgid).map_or(&[][..], Vec::as_slice);
                self.judge_goroutine_call(&call, threads, &mut looks);
                continue;
            }
            let tid = thread_tid(call.thread);
            let look = looks.entry(tid).or_insert_with(|| self.taken(tid));
            if let Some(look) = look.as_ref() {
                self.judge_call(&call, tid, look);
            }
        }
    }

    /// Judges a Go call on the look that shows its goroutine running — at any thread of
    /// its process — or, when no thread runs it, on its saved state. A goroutine seen
    /// nowhere (between a thread and its saved state, or on the scheduler's stack) is
    /// looked for again next scan, with no judgement.
    fn judge_goroutine_call(
        &mut self,
        call: &FunctionCall,
        threads: &[u32],
        looks: &mut HashMap<u32, Option<Taken>>,
    ) {
        for &tid in threads {
            looks.entry(tid).or_insert_with(|| self.taken(tid));
        }
        let seen = threads.iter().find_map(|tid| {
            let look = looks.get(tid)?.as_ref()?;
            look.go
                .runs(call.thread, look.copy.regs.sp)
                .then_some((*tid, look))
        });
        if let Some((tid, look)) = seen {
            self.judge_call(call, tid, look);
            return;
        }
        if let Some((look_ns, copy, go)) = goroutine::parked(call.tgid, call.thread) {
            self.stats.looks.fetch_add(1, Ordering::Relaxed);
            let look = Taken { look_ns, copy, go };
            // On no thread: the trigger names the process's main thread.
            self.judge_call(call, call.tgid, &look);
        }
    }

    /// Fires a syscall still in flight for each running rule it met, with the look at its
    /// thread (when there is one) as its stack.
    fn fire_syscall(&mut self, call: &Syscall, look: Option<&Taken>) {
        let head = args(INFLIGHT_SYSCALL, u64::from(call.tid), call.tgid, call.tid);
        let mut decided = false;
        for &rule in &call.rules {
            if let Some(look) = look {
                stacks().put(call.tid, call.entry_ns, look.copy.clone());
            }
            let all = [
                head[0],
                head[1],
                head[2],
                u64::from(rule),
                call.entry_ns,
                0,
                0,
                0,
            ];
            decided |= self.fire(call.tid, call.entry_ns, &all) != Fired::NotMet;
        }
        if decided {
            self.decided.insert((u64::from(call.tid), call.entry_ns));
        }
    }

    /// No running rule (any more): no look wanted, no tick.
    fn idle(&mut self) {
        for tid in std::mem::take(&mut self.wanted).into_keys() {
            let _ = self.handles.want_look.remove(&tid);
        }
        self.ticks.set(false);
        self.decided.clear();
        self.unproven.clear();
    }

    /// The `detect: running` rules: (id, spec).
    fn running_rules(&self, mask: u64) -> Vec<(u32, RuleSpec)> {
        (0..64u32)
            .filter(|id| mask >> id & 1 == 1)
            .filter_map(|id| Some((id, self.handles.rules.get(&id, 0).ok()?)))
            .collect()
    }

    /// Every frame of `RUNNING_TIMES` of a running function rule that is older than the
    /// rule's threshold and not decided, whose thread is alive; every such frame's key
    /// goes to `present`.
    fn function_calls(
        &mut self,
        rules: &[(u32, RuleSpec)],
        now: u64,
        present: &mut HashSet<(u64, u64)>,
    ) -> Vec<FunctionCall> {
        let min_of: HashMap<u32, u64> = rules
            .iter()
            .filter(|(_, r)| r.kind == KIND_FUNCTION)
            .map(|(id, r)| (*id, r.min_duration_ns))
            .collect();
        if min_of.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        // Processes with calls in flight: their unwind tables are read before any call is
        // old enough, so that a proof is an unwind, not a read of every file's CFI (tens
        // of ms between the look and the fire, and the freeze).
        let mut young = HashSet::new();
        for item in &self.handles.running_times {
            let Ok((key, stack)) = item else {
                continue;
            };
            let Some(&min_ns) = min_of.get(&key.rule_id) else {
                continue;
            };
            let depth = usize::try_from(stack.depth)
                .unwrap_or(0)
                .min(stack.frames.len());
            if depth > 0 {
                young.insert(key.tgid);
            }
            for frame in &stack.frames[..depth] {
                if now.saturating_sub(frame.entry_ns) < min_ns {
                    continue;
                }
                let id = (key.thread, frame.entry_ns);
                present.insert(id);
                let go = stack.go != 0;
                let alive = if go {
                    thread_alive(key.tgid, key.tgid)
                } else {
                    thread_alive(key.tgid, thread_tid(key.thread))
                };
                if !self.decided.contains(&id) && alive {
                    out.push(FunctionCall {
                        thread: key.thread,
                        tgid: key.tgid,
                        rule_id: key.rule_id,
                        min_ns,
                        go,
                        frame: *frame,
                    });
                }
            }
        }
        for tgid in young {
            self.unwind.prepare(tgid);
        }
        out
    }

    /// Every syscall in flight past a running syscall rule's threshold, not decided; their
    /// keys go to `present`. A start whose thread is gone is removed.
    fn syscalls(
        &mut self,
        rules: &[(u32, RuleSpec)],
        syscall_rules: u64,
        now: u64,
        present: &mut HashSet<(u64, u64)>,
    ) -> Vec<Syscall> {
        let rules: Vec<&(u32, RuleSpec)> = rules
            .iter()
            .filter(|(id, r)| r.kind == KIND_SYSCALL && syscall_rules >> id & 1 == 1)
            .collect();
        if rules.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for item in &self.handles.syscall_start {
            let Ok((tid, start)) = item else {
                continue;
            };
            let age = now.saturating_sub(start.enter_ns);
            let met: Vec<u32> = rules
                .iter()
                .filter(|(id, r)| {
                    start.rules >> id & 1 == 1
                        && r.has_syscall(start.nr)
                        && age >= r.min_duration_ns
                })
                .map(|(id, _)| *id)
                .collect();
            if met.is_empty() || NEVER_RETURN.contains(&start.nr) {
                continue;
            }
            if start.tgid == 0 || !thread_alive(start.tgid, tid) {
                gone.push(tid);
                continue;
            }
            let id = (u64::from(tid), start.enter_ns);
            present.insert(id);
            if !self.decided.contains(&id) {
                out.push(Syscall {
                    tid,
                    tgid: start.tgid,
                    entry_ns: start.enter_ns,
                    rules: met,
                });
            }
        }
        for tid in gone {
            let _ = self.handles.syscall_start.remove(&tid);
        }
        out
    }
    /// Asks for a look at each of `tids` not asked for yet (as many as there are slots),
    /// and withdraws the asks for threads no longer wanted.
    fn want(&mut self, tids: &HashSet<u32>, now: u64) {
        let gone: Vec<u32> = self
            .wanted
            .keys()
            .filter(|t| !tids.contains(t))
            .copied()
            .collect();
        for tid in gone {
            self.wanted.remove(&tid);
            let _ = self.handles.want_look.remove(&tid);
        }
        for &tid in tids {
            if self.wanted.contains_key(&tid) {
                continue;
            }
            let used: HashSet<u32> = self.wanted.values().map(|w| w.slot).collect();
            let Some(slot) = (0..MAX_LOOKS).find(|s| !used.contains(s)) else {
                break; // the rest waits for a free slot
            };
            if self.handles.want_look.insert(tid, slot, 0).is_ok() {
                self.wanted.insert(
                    tid,
                    Wanted {
                        slot,
                        since_ns: now,
                    },
                );
            }
        }
    }

    /// One pass of the task iterator: looks at the wanted threads that are off CPU.
    fn run_iterator(&mut self) {
        if self.link.is_none() {
            match bpf::iter_link_create(self.handles.look.as_fd()) {
                Ok(link) => self.link = Some(link),
                Err(e) => {
                    if !self.no_iterator {
                        log::warn!("in-flight looks at threads off CPU unavailable: {e}");
                        self.no_iterator = true;
                    }
                    return;
                }
            }
        }
        let Some(link) = &self.link else {
            return;
        };
        match bpf::iter_create(link.as_fd()) {
            Ok(fd) => {
                let mut file = std::fs::File::from(fd);
                let mut sink = Vec::new();
                if let Err(e) = file.read_to_end(&mut sink) {
                    log::debug!("in-flight task iterator: {e}");
                }
            }
            Err(e) => log::debug!("in-flight task iterator: {e}"),
        }
    }

    /// The look at `tid` taken since it was asked for, if any; the ask is then done.
    fn taken(&mut self, tid: u32) -> Option<Taken> {
        let wanted = *self.wanted.get(&tid)?;
        let look = self.handles.looks.get(&wanted.slot, 0).ok()?;
        if look.tid != tid || look.look_ns < wanted.since_ns || look.copy.len == 0 {
            if self.handles.want_look.get(&tid, 0).is_err() {
                // Claimed and not published (a look that could not be taken): ask again.
                self.wanted.remove(&tid);
            }
            return None;
        }
        self.wanted.remove(&tid);
        self.stats.looks.fetch_add(1, Ordering::Relaxed);
        let len = usize::try_from(look.copy.len)
            .unwrap_or(0)
            .min(look.copy.bytes.len());
        Some(Taken {
            look_ns: look.look_ns,
            copy: StackCopy {
                regs: UserRegs {
                    ip: look.copy.ip,
                    sp: look.copy.sp,
                    bp: look.copy.bp,
                },
                bytes: look.copy.bytes[..len].to_vec(),
            },
            go: GoStack {
                g: look.g,
                lo: look.g_lo,
                hi: look.g_hi,
            },
        })
    }

    /// Judges a function call on a look at thread `tid` (Go: the thread that ran its
    /// goroutine), and fires it when the look proves it inside past its threshold.
    fn judge_call(&mut self, call: &FunctionCall, tid: u32, look: &Taken) {
        if look.look_ns < call.frame.entry_ns.saturating_add(call.min_ns) {
            return; // looked too early: asked again next scan
        }
        // The frame where the look's stack holds it (Go: from the stack's top now).
        let mut at = call.frame;
        if call.go {
            at.height = look.go.address(call.frame.height);
        }
        let proof = self.unwind.prove(call.tgid, &at, &look.copy, look.look_ns);
        log::debug!(
            "in-flight: thread {tid} call entered at {} (height {:#x}): {proof:?} by a look at {}",
            call.frame.entry_ns,
            at.height,
            look.look_ns
        );
        let key = (call.thread, call.frame.entry_ns);
        match proof {
            Proof::Inside => {
                stacks().put(tid, call.frame.entry_ns, look.copy.clone());
                let a = args(INFLIGHT_FUNCTION, call.thread, call.tgid, tid);
                let args = [
                    a[0],
                    a[1],
                    a[2],
                    u64::from(call.rule_id),
                    call.frame.entry_ns,
                    look.look_ns,
                    call.frame.height,
                    0,
                ];
                self.fire(tid, call.frame.entry_ns, &args);
            }
            Proof::Ended => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            Proof::Unproven => {
                let tries = self.unproven.entry(key).or_insert(0);
                *tries += 1;
                if *tries < UNPROVEN_TRIES {
                    return; // another look next scan
                }
                self.stats.unproven.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.decided.insert(key);
    }

    /// Runs the fire program with `head` (8 arguments) and the thread's comm. The stack
    /// left for the call is taken back unless a trigger was sent.
    fn fire(&self, tid: u32, entry_ns: u64, head: &[u64; 8]) -> Fired {
        let process = u32::try_from(head[2] >> 32).unwrap_or(0);
        let comm = comm_words(process, tid);
        let mut all = [0u64; INFLIGHT_ARGS];
        all[..8].copy_from_slice(head);
        all[8] = comm[0];
        all[9] = comm[1];
        let fired = match bpf::test_run_raw_tp(self.handles.fire.as_fd(), &all) {
            Ok(rc) if rc == INFLIGHT_SENT.cast_unsigned() => Fired::Sent,
            Ok(rc) if rc == INFLIGHT_SUPPRESSED.cast_unsigned() => Fired::Suppressed,
            Ok(_) => Fired::NotMet,
            Err(e) => {
                log::debug!("in-flight trigger of thread {tid} not fired: {e}");
                Fired::NotMet
            }
        };
        if fired == Fired::Sent {
            self.stats.fired.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = stacks().take(tid, entry_ns);
        }
        fired
    }
}

/// The first arguments of the fire program: kind, thread key, and the kernel's
/// `pid_tgid` (process above, thread below).
fn args(kind: u64, thread: u64, process: u32, tid: u32) -> [u64; 3] {
    [kind, thread, u64::from(process) << 32 | u64::from(tid)]
}

/// The kernel thread id behind an `ENTRY_TIMES` thread key (not Go: a tid).
fn thread_tid(thread: u64) -> u32 {
    u32::try_from(thread).unwrap_or(0)
}

/// The threads of process `tgid` (at most [`MAX_GO_THREADS`]); none when it is gone.
fn threads_of(tgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{tgid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .take(MAX_GO_THREADS)
        .collect()
}

fn thread_alive(process: u32, tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{process}/task/{tid}")).exists()
}

/// The thread's comm as the two little-endian words of the record's 16 bytes.
fn comm_words(process: u32, tid: u32) -> [u64; 2] {
    // Never empty: the kernel would put the agent's own comm in an empty one.
    let comm = std::fs::read_to_string(format!("/proc/{process}/task/{tid}/comm"))
        .unwrap_or_else(|_| "?".to_owned());
    let comm = if comm.trim_end().is_empty() {
        "?"
    } else {
        comm.trim_end()
    };
    let mut bytes = [0u8; 16];
    for (dst, src) in bytes.iter_mut().zip(comm.bytes().take(15)) {
        *dst = src;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    [word(0), word(8)]
}

/// Files whose unwind sections are kept between scans at most (then read again).
const MAX_UNWIND_FILES: usize = 512;

/// How long a process's maps are used for unwinding before they are read again.
const MAPS_FOR_NS: u64 = 2_000_000_000;

/// Processes' maps and files' unwind sections, kept between scans so that a proof costs
/// an unwind, not a read of every file's CFI (which took 20 ms: long enough for a slow
/// call to end between its look and its fire).
#[derive(Default)]
struct UnwindCache {
    maps: HashMap<u32, ProcessMaps>,
    files: UnwindFiles,
}

impl UnwindCache {
    /// Unwinds `copy` with process `tgid`'s modules and judges `frame` on it; an
    /// unproven judgement on maps older than the look is tried again on fresh maps (a
    /// library loaded since).
    fn prove(&mut self, tgid: u32, frame: &RunningFrame, copy: &StackCopy, look_ns: u64) -> Proof {
        let now = sys::monotonic_ns();
        if self.stale(tgid, now) {
            self.refresh(tgid, now);
        }
        let proof = self.judge(tgid, frame, copy);
        let older = self.maps.get(&tgid).is_some_and(|m| m.read_at_ns < look_ns);
        if proof == Proof::Unproven && older {
            self.refresh(tgid, now);
            return self.judge(tgid, frame, copy);
        }
        proof
    }

    /// Reads process `tgid`'s maps and its files' unwind sections if they are not read
    /// yet (or are stale).
    fn prepare(&mut self, tgid: u32) {
        let now = sys::monotonic_ns();
        if self.stale(tgid, now) {
            self.refresh(tgid, now);
            let empty = StackCopy {
                regs: UserRegs::default(),
                bytes: Vec::new(),
            };
            let _ = self.judge(tgid, &RunningFrame::default(), &empty);
        }
    }

    /// Whether process `tgid`'s maps are missing or older than [`MAPS_FOR_NS`] at `now`.
    fn stale(&self, tgid: u32, now: u64) -> bool {
        self.maps
            .get(&tgid)
            .is_none_or(|m| now.saturating_sub(m.read_at_ns) > MAPS_FOR_NS)
    }

    fn refresh(&mut self, tgid: u32, now: u64) {
        if self.maps.len() > 1024 {
            self.maps.clear();
        }
        match procmaps::read_process(tgid, now) {
            Ok(maps) => {
                self.maps.insert(tgid, maps);
            }
            Err(_) => {
                self.maps.remove(&tgid);
            }
        }
    }

    fn judge(&mut self, tgid: u32, frame: &RunningFrame, copy: &StackCopy) -> Proof {
        let maps: Vec<ProcessMaps> = self.maps.get(&tgid).cloned().into_iter().collect();
        let mut files = std::mem::take(&mut self.files);
        if files.len() > MAX_UNWIND_FILES {
            files = UnwindFiles::default();
        }
        let mut unwinder = StackUnwinder::with_files(&maps, &[], files);
        let frames = unwinder.frames_with_cfa(tgid, copy.regs, &copy.bytes);
        self.files = unwinder.into_files();
        proof::judge(frame, copy.regs.sp, &copy.bytes, &frames)
    }
}
