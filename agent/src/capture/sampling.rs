//! The sampling recorder: timer (cpu-clock) or cycles samples with IP, TID, TIME, CPU,
//! PERIOD and the user registers and stack (or the frame-pointer CALLCHAIN), a sample of
//! every context switch out of a traced thread with the same fields plus the
//! `PERF_RECORD_SWITCH` records of switches in and out (so off-CPU time is seen, not
//! guessed from missing samples), and MMAP2/COMM/FORK/EXIT tracking records, all into one
//! overwrite ring per CPU. Works on any Linux ≥ 4.7 (`write_backward`, `PAUSE_OUTPUT`), VMs
//! included.
//!
//! Freeze = `PERF_EVENT_IOC_PAUSE_OUTPUT` on every ring (the events keep running, nothing
//! is written), copy the rings newest-to-oldest into oldest-first streams, read the maps
//! of every process seen in the samples. Resume = un-pause. Record timestamps use
//! `CLOCK_MONOTONIC` (`use_clockid`), the clock of the BPF trigger timestamps.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    os::fd::{BorrowedFd, OwnedFd},
    sync::Arc,
};

use perf_event_open_sys::bindings::{
    PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_SW_CONTEXT_SWITCHES, PERF_COUNT_SW_CPU_CLOCK,
    PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE,
};

use super::{
    Backend, CaptureError, CaptureOptions, CapturedData, ClockConversion, EmbedCode, PeerSet,
    Recorder, RecorderParams, RingData, RingKind, SamplingEvent,
    events::{CpuRing, EventSet, EventSpec, online_cpus},
    freeze::{FreezeSwitch, StopMethod},
    kallsyms::Kallsyms,
    mmap_records, pages_for, procmaps,
    records::{
        self, Layout, PERF_CONTEXT_MAX, SAMPLE_CALLCHAIN, SAMPLE_CPU, SAMPLE_IDENTIFIER, SAMPLE_IP,
        SAMPLE_PERIOD, SAMPLE_REGS_USER, SAMPLE_STACK_USER, SAMPLE_TID, SAMPLE_TIME, StreamSummary,
        UNWIND_REGS,
    },
    ring::PerfRing,
};
use crate::sys::perf::{self, perf_event_attr};

/// What the sampling recorder asks for in every sample: its event, IP, thread, time, CPU and
/// period; with a stack copy (`stack_size` > 0) the user registers and stack, and the
/// callchain only for its kernel part (`include_kernel`); without, the kernel's
/// frame-pointer callchain.
#[must_use]
pub fn sample_type(stack_size: u32, include_kernel: bool) -> u64 {
    // The identifier tells the timer's samples from the context switches' in one ring.
    let base =
        SAMPLE_IDENTIFIER | SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_PERIOD;
    if stack_size == 0 {
        base | SAMPLE_CALLCHAIN
    } else if include_kernel {
        base | SAMPLE_CALLCHAIN | SAMPLE_REGS_USER | SAMPLE_STACK_USER
    } else {
        base | SAMPLE_REGS_USER | SAMPLE_STACK_USER
    }
}

impl CpuRing for PerfRing {
    fn output_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

/// The `perf_event_attr` of the sampling event; `stack_size` bytes of user stack per
/// sample (0: none, callchains by frame pointers).
pub fn sampling_attr(
    event: SamplingEvent,
    frequency: u64,
    include_kernel: bool,
    stack_size: u32,
) -> perf_event_attr {
    let (type_, config) = match event {
        SamplingEvent::Cycles => (PERF_TYPE_HARDWARE, u64::from(PERF_COUNT_HW_CPU_CYCLES)),
        SamplingEvent::CpuClock => (PERF_TYPE_SOFTWARE, u64::from(PERF_COUNT_SW_CPU_CLOCK)),
    };
    let mut attr = perf_event_attr {
        type_,
        config,
        sample_type: sample_type(stack_size, include_kernel),
        ..perf_event_attr::default()
    };
    if stack_size > 0 {
        // The unwinder's registers and the stack above SP; the user callchain is then the
        // unwinder's job (a frame-pointer walk of code without them reads garbage).
        attr.sample_regs_user = UNWIND_REGS;
        attr.sample_stack_user = stack_size;
        attr.set_exclude_callchain_user(1);
    }
    attr.__bindgen_anon_1.sample_freq = frequency.max(1);
    attr.set_freq(1);
    attr.set_inherit(1);
    // Samples in the kernel are kept either way: without `include_kernel` they are a
    // `[kernel]` frame on the user stack (a thread running a syscall is not off-CPU),
    // with it the kernel's callchain too.
    attr.set_exclude_callchain_kernel(u64::from(!include_kernel));
    attr.set_exclude_hv(1);
    attr.set_mmap(1);
    attr.set_mmap2(1);
    attr.set_comm(1);
    attr.set_comm_exec(1);
    attr.set_task(1);
    attr.set_sample_id_all(1);
    attr.set_write_backward(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    attr
}

/// The `perf_event_attr` of the context-switch event beside the timer (`timer`): a sample
/// at every switch out of a traced thread, with the same fields as the timer's (the user
/// registers and stack where the thread blocked or was preempted), and the
/// `PERF_RECORD_SWITCH` records of every switch in and out. The sample is taken in the
/// scheduler, so it must not exclude the kernel; its kernel callchain is excluded unless
/// `include_kernel`.
pub fn switch_attr(timer: &perf_event_attr, include_kernel: bool) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_: PERF_TYPE_SOFTWARE,
        config: u64::from(PERF_COUNT_SW_CONTEXT_SWITCHES),
        sample_type: timer.sample_type,
        sample_regs_user: timer.sample_regs_user,
        sample_stack_user: timer.sample_stack_user,
        ..perf_event_attr::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    attr.set_inherit(1);
    attr.set_exclude_hv(1);
    attr.set_exclude_callchain_kernel(u64::from(!include_kernel));
    attr.set_exclude_callchain_user(timer.exclude_callchain_user());
    attr.set_context_switch(1);
    attr.set_sample_id_all(1);
    attr.set_write_backward(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    attr
}

/// Samples into per-CPU overwrite rings.
pub struct SamplingRecorder {
    events: EventSet<PerfRing>,
    /// The timer (the CPU's ring) and the context switches (redirected into it).
    spec: [EventSpec; 2],
    data_pages: usize,
    params: RecorderParams,
    embed_code: EmbedCode,
    /// Processes given to `add_process`, and the maps last read while they were alive.
    pids: BTreeSet<u32>,
    known_maps: BTreeMap<u32, procmaps::ProcessMaps>,
    /// The `/proc/PID/maps` text behind each `known_maps` entry (skip unchanged re-reads).
    maps_text: BTreeMap<u32, String>,
    /// The perf maps of the JIT runtimes among them, as last read (for a process gone by
    /// its freeze).
    perf_maps: super::perf_map::PerfMapWatch,
    /// Processes of `known_maps` found gone, oldest first: their maps are kept for a
    /// snapshot whose rings still hold their samples, but only the last [`GONE_KEPT`] (a
    /// pre-fork server's churn made the cache grow by every child it ever had).
    gone: VecDeque<u32>,
    /// Pauses the rings from the trigger pump's thread; the recorder pauses through it too.
    switch: Arc<FreezeSwitch>,
    /// The online CPUs, in ring-slot order of `switch`.
    cpus: Vec<u32>,
    /// The kernel's symbols, read at the first open with `include_kernel` (else none).
    kallsyms: Option<&'static Kallsyms>,
    /// One event per CPU for every task, shared by all targets ([`Self::open_cpu_wide`]):
    /// a snapshot keeps only its process's records, and maps are read at the freeze.
    cpu_wide: bool,
    /// Where a running shared ring is copied (kept: its pages stay faulted in).
    scratch: Vec<u8>,
}

// The recorder moves to the thread that freezes it: it must be `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<SamplingRecorder>();
};

impl SamplingRecorder {
    /// Sets up (no process yet: see [`Recorder::add_process`]).
    pub fn open(opts: &CaptureOptions, event: SamplingEvent) -> Result<Self, CaptureError> {
        let data_pages = pages_for(opts.buffer_size)?;
        let page = crate::sys::page_size().ok_or(CaptureError::PageSize)?;
        let attr = sampling_attr(
            event,
            opts.sample_frequency,
            opts.include_kernel,
            opts.stack_size,
        );
        let cpus = online_cpus()?;
        let params = RecorderParams {
            event: event.as_str().to_owned(),
            perf_type: attr.type_,
            config: attr.config,
            sample_type: attr.sample_type,
            sample_regs_user: attr.sample_regs_user,
            sample_stack_user: u64::from(attr.sample_stack_user),
            sample_id_all: true,
            sample_frequency: Some(opts.sample_frequency),
            buffer_size: (data_pages * page) as u64,
            include_kernel: opts.include_kernel,
            clockid: Some(libc::CLOCK_MONOTONIC),
            cpus: cpus.clone(),
            ..RecorderParams::default()
        };
        Ok(Self {
            switch: Arc::new(FreezeSwitch::new(StopMethod::PauseOutput, cpus.len())),
            cpus: cpus.clone(),
            events: EventSet::new(cpus),
            spec: [
                EventSpec {
                    name: event.as_str(),
                    attr,
                    filter: None,
                    bpf_prog: None,
                    group: None,
                    keep: None,
                },
                EventSpec {
                    name: "context-switches",
                    attr: switch_attr(&attr, opts.include_kernel),
                    filter: None,
                    bpf_prog: None,
                    group: None,
                    keep: None,
                },
            ],
            data_pages,
            params,
            embed_code: opts.embed_code,
            pids: BTreeSet::new(),
            known_maps: BTreeMap::new(),
            maps_text: BTreeMap::new(),
            perf_maps: super::perf_map::PerfMapWatch::default(),
            gone: VecDeque::new(),
            kallsyms: opts.include_kernel.then(Kallsyms::shared),
            cpu_wide: false,
            scratch: Vec::new(),
        })
    }

    /// The per-CPU recorder shared by every target of the agent's rules: one timer and one
    /// context-switch event per CPU for all tasks (`pid = -1`), whose samples BPF program
    /// `filter` (the engine's `target_filter`) keeps only for target processes. Memory is
    /// CPUs × `buffer_size` and fds 2 × CPUs, whatever the number of targets; a process
    /// the kernel makes a target at exec is recorded from its first instruction.
    ///
    /// The trade-off: all targets on a CPU share its ring, so a busy target shortens the
    /// window of a quiet one (a larger `buffer_size`, or `capture.isolate: true` for
    /// per-process rings). MMAP2/COMM/FORK/EXIT and `SWITCH_CPU_WIDE` records are written
    /// for every process on the CPU (they are not samples: the filter cannot drop them);
    /// a snapshot keeps its own process's.
    pub fn open_cpu_wide(
        opts: &CaptureOptions,
        event: SamplingEvent,
        filter: BorrowedFd<'_>,
    ) -> Result<Self, CaptureError> {
        let mut recorder = Self::open(opts, event)?;
        recorder.cpu_wide = true;
        for spec in &mut recorder.spec {
            // Inheritance means nothing to an event that follows a CPU.
            spec.attr.set_inherit(0);
        }
        recorder.set_filter(filter)?;
        let pages = recorder.data_pages;
        let (switch, cpus) = (&recorder.switch, &recorder.cpus);
        let mut make_ring = |fd, cpu| map_ring(pages, switch, cpus, fd, cpu);
        recorder
            .events
            .add_cpu_wide(&recorder.spec, &mut make_ring)?;
        recorder.note_switch_ids()?;
        Ok(recorder)
    }

    /// Adds the ids of the context-switch events opened so far to the params (the decoder
    /// tells their samples from the timer's by them).
    fn note_switch_ids(&mut self) -> Result<(), CaptureError> {
        for fd in self.events.followers_of(1) {
            let id = perf::event_id(fd).map_err(|source| CaptureError::Syscall {
                what: "reading a context-switch event's id",
                source,
            })?;
            if !self.params.switch_ids.contains(&id) {
                self.params.switch_ids.push(id);
            }
        }
        Ok(())
    }

    /// The maps of a process gone before the freeze: those its records in `rings` show
    /// when it exec'd after the last maps read of it ([`mmap_records`]), else those.
    fn gone_maps(
        &self,
        pid: u32,
        recorded: mmap_records::RecordedMaps,
    ) -> Option<procmaps::ProcessMaps> {
        let old = self.known_maps.get(&pid);
        match recorded.exec {
            Some((exec, comm))
                if old.is_none_or(|o| o.read_at_ns < exec) && !recorded.maps.is_empty() =>
            {
                log::debug!(
                    "pid {pid}: gone before the freeze; its maps since its exec rebuilt from \
                     {} mmap records",
                    recorded.maps.len()
                );
                Some(procmaps::ProcessMaps {
                    pid,
                    comm,
                    exe: None,
                    read_at_ns: exec,
                    at_freeze: false,
                    maps: recorded.maps.into_iter().map(|m| m.entry).collect(),
                    origin: crate::capture::origin::ProcessOrigin::default(),
                })
            }
            _ => old.map(|o| {
                // Read while the loader was still at work, or before a dlopen: what was
                // mapped since is in the records.
                let mut maps = o.clone();
                maps.at_freeze = false;
                let since: Vec<_> = recorded.since(o.read_at_ns).collect();
                if !since.is_empty() {
                    log::debug!(
                        "pid {pid}: gone before the freeze; its maps read earlier completed \
                         by {} mmap records made since",
                        since.len()
                    );
                    mmap_records::overlay(&mut maps.maps, since);
                }
                maps
            }),
        }
    }

    /// Drops the maps of the processes found gone longest ago, down to `keep` of them.
    fn forget_gone(&mut self, keep: usize) {
        while self.gone.len() > keep {
            if let Some(pid) = self.gone.pop_front() {
                self.known_maps.remove(&pid);
                self.maps_text.remove(&pid);
                self.perf_maps.forget(pid);
            }
        }
    }

    /// Pauses every ring (again, when the switch already did: the ioctl is idempotent,
    /// and here a failure is reported).
    fn pause_all(&self) -> Result<(), CaptureError> {
        for (_, ring) in self.events.rings() {
            perf::pause_output(ring.fd(), true).map_err(|source| CaptureError::Syscall {
                what: "pausing a sample ring",
                source,
            })?;
        }
        Ok(())
    }

    /// Maps of every process in `pids`, read now; when it is gone, the last ones read, or
    /// those its records in `rings` show when it exec'd since ([`mmap_records`]).
    fn collect_maps(
        &mut self,
        pids: &BTreeSet<u32>,
        rings: &[RingData],
    ) -> Vec<procmaps::ProcessMaps> {
        let now = super::monotonic_ns();
        let mut out = Vec::new();
        let mut gone = BTreeSet::new();
        for &pid in pids {
            if let Ok(maps) = procmaps::read_process(pid, now) {
                self.known_maps.insert(pid, maps.clone());
                out.push(maps);
            } else {
                gone.insert(pid);
            }
        }
        if gone.is_empty() {
            return out;
        }
        // One pass over the rings for all of them (a snapshot of peers may have hundreds).
        let streams = rings.iter().map(|r| r.data.as_slice());
        let mut recorded = mmap_records::recorded_maps_of(&gone, self.params.sample_type, streams);
        for pid in gone {
            let rec = recorded.remove(&pid).unwrap_or_default();
            out.extend(self.gone_maps(pid, rec));
        }
        out
    }
}

/// Maps the overwrite ring of `pages` data pages of the first event opened on `cpu` and
/// registers it with the freeze `switch` (its slot: the CPU's place in `cpus`).
fn map_ring(
    pages: usize,
    switch: &FreezeSwitch,
    cpus: &[u32],
    fd: OwnedFd,
    cpu: u32,
) -> Result<PerfRing, CaptureError> {
    let ring = PerfRing::map(fd, pages, true)?;
    let slot = cpus.iter().position(|&c| c == cpu).unwrap_or(usize::MAX);
    switch.add_ring(slot, ring.fd())?;
    Ok(ring)
}

/// Which records of the shared rings a snapshot keeps.
#[derive(Debug, Clone, Copy)]
enum Keep<'a> {
    /// The triggering process's.
    Process(u32),
    /// Those of the targets with samples in the rings, and the triggering process's
    /// (`capture.peers`): every one (`None`), or those of the set and their children.
    Targets(u32, Option<&'a BTreeSet<u32>>),
}

/// `allowed` and the processes the `FORK` records of `streams` show them fork, in time
/// order (a child's own children too): the children of a rule's processes that lived
/// too briefly for the agent to learn of them.
fn with_children<'s>(
    mut allowed: BTreeSet<u32>,
    streams: impl Iterator<Item = &'s [u8]>,
) -> BTreeSet<u32> {
    let word = |body: &[u8], at: usize| {
        body.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let mut forks: Vec<(u64, u32, u32)> = streams
        .flat_map(records::records)
        .filter(|r| r.kind == records::PERF_RECORD_FORK)
        .filter_map(|r| {
            // pid, ppid, tid, ptid, time.
            let time = r
                .body
                .get(16..24)?
                .try_into()
                .ok()
                .map(u64::from_le_bytes)?;
            Some((time, word(r.body, 0)?, word(r.body, 4)?))
        })
        .collect();
    forks.sort_unstable();
    for (_, child, parent) in forks {
        if allowed.contains(&parent) {
            allowed.insert(child);
        }
    }
    allowed
}

/// How many gone processes' maps a recorder keeps (the most recently gone): a ring of a
/// few MiB holds the samples of far fewer processes than that.
const GONE_KEPT: usize = 256;

/// The kernel addresses of the samples in `stream`: IPs and kernel callchain entries.
fn kernel_addresses(layout: Layout, stream: &[u8]) -> Vec<u64> {
    records::records(stream)
        .filter(|r| r.kind == records::PERF_RECORD_SAMPLE)
        .filter_map(|r| records::parse_sample(layout, r.body))
        .flat_map(|s| s.ip.into_iter().chain(s.callchain))
        .filter(|&a| crate::sys::is_kernel_address(a) && a < PERF_CONTEXT_MAX)
        .collect()
}

impl Recorder for SamplingRecorder {
    fn backend(&self) -> Backend {
        Backend::Sampling
    }

    /// Keeps the maps of the traced processes (and their children) current while they are
    /// alive, so a process that exits between its trigger and the freeze still has maps
    /// in its snapshot. Unchanged maps cost one read of `/proc/PID/maps`.
    fn poll(&mut self) -> Result<(), CaptureError> {
        if self.cpu_wide {
            // Maps come from the rings' MMAP2 records, or /proc at the freeze.
            return Ok(());
        }
        let mut pids: BTreeSet<u32> = self.pids.iter().copied().collect();
        pids.extend(
            self.known_maps
                .keys()
                .filter(|pid| !self.gone.contains(pid))
                .copied(),
        );
        let children: Vec<u32> = pids.iter().flat_map(|&p| procmaps::children(p)).collect();
        pids.extend(children);
        let now = super::monotonic_ns();
        for pid in pids {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
                if self.known_maps.contains_key(&pid) && !self.gone.contains(&pid) {
                    self.gone.push_back(pid);
                }
                continue;
            };
            if self.maps_text.get(&pid) == Some(&text) {
                continue;
            }
            if let Ok(maps) = procmaps::read_process(pid, now) {
                // A pid seen gone and now alive again is a new process with it.
                self.gone.retain(|&g| g != pid);
                self.known_maps.insert(pid, maps);
                self.maps_text.insert(pid, text);
            }
        }
        for (pid, maps) in &self.known_maps {
            if !self.gone.contains(pid) {
                self.perf_maps.refresh(maps);
            }
        }
        self.forget_gone(GONE_KEPT);
        Ok(())
    }

    fn params(&self) -> &RecorderParams {
        &self.params
    }

    fn add_process(&mut self, pid: u32) -> Result<(), CaptureError> {
        if self.cpu_wide {
            // Already recorded (the kernel's target set decides): only its maps, kept in
            // case it is gone by the freeze of its snapshot.
            let maps = procmaps::read_target(pid)?;
            self.gone.retain(|&g| g != pid);
            self.known_maps.insert(pid, maps);
            self.pids.insert(pid);
            return Ok(());
        }
        let pages = self.data_pages;
        let (switch, cpus) = (&self.switch, &self.cpus);
        let mut make_ring = |fd, cpu| map_ring(pages, switch, cpus, fd, cpu);
        self.events.add_process(pid, &self.spec, &mut make_ring)?;
        self.note_switch_ids()?;
        if let Ok(maps) = procmaps::read_process(pid, super::monotonic_ns()) {
            self.known_maps.insert(pid, maps);
        }
        self.pids.insert(pid);
        Ok(())
    }

    fn remove_process(&mut self, pid: u32) {
        if self.pids.remove(&pid) && self.known_maps.contains_key(&pid) {
            self.gone.push_back(pid);
            self.forget_gone(GONE_KEPT);
        }
    }

    fn freeze(&mut self) -> Result<CapturedData, CaptureError> {
        self.freeze_keeping(None)
    }

    fn freeze_for(&mut self, pid: u32, peers: &PeerSet) -> Result<CapturedData, CaptureError> {
        let keep = match (self.cpu_wide, peers) {
            (false, _) => None,
            (true, PeerSet::None) => Some(Keep::Process(pid)),
            (true, PeerSet::Of(set)) => Some(Keep::Targets(pid, Some(set))),
            (true, PeerSet::All) => Some(Keep::Targets(pid, None)),
        };
        self.freeze_keeping(keep)
    }

    fn resume(&mut self) -> Result<(), CaptureError> {
        self.switch.thaw().map_err(|source| CaptureError::Syscall {
            what: "resuming a sample ring",
            source,
        })
    }

    fn freeze_switch(&self) -> Option<Arc<FreezeSwitch>> {
        Some(Arc::clone(&self.switch))
    }

    fn set_sample_filter(&mut self, prog: BorrowedFd<'_>) -> Result<bool, CaptureError> {
        self.set_filter(prog)?;
        Ok(true)
    }
}

impl SamplingRecorder {
    /// Copies the rings: paused, everything, with the maps of every process seen (`None`);
    /// running, cut down to `keep`'s processes (the per-CPU recorder).
    fn freeze_keeping(&mut self, only: Option<Keep<'_>>) -> Result<CapturedData, CaptureError> {
        let before = super::monotonic_ns();
        let (freeze_time_ns, pause_duration_ns) = if only.is_some() {
            // Shared rings are copied running: the others go on recording, the triggering
            // process's samples are stopped by the kernel's freeze mark.
            (before, 0)
        } else {
            self.pause_all()?;
            let after = super::monotonic_ns();
            // The pump may have stopped the rings at the trigger already: that moment
            // counts.
            self.switch.settle(before, after)
        };
        let pair = super::ClockPair::now();
        let mut rings = Vec::new();
        let mut summary = StreamSummary::default();
        let mut clock = None;
        let mut copies = Vec::new();
        for (cpu, ring) in self.events.rings() {
            let copy = match only {
                Some(Keep::Process(pid)) => {
                    let mut copy = ring.copy_backward_live(&mut self.scratch);
                    let (kept, count) =
                        records::retain_processes(self.params.sample_type, &copy.data, |p| {
                            p == pid
                        });
                    copy.data = kept;
                    copy.records = usize::try_from(count).unwrap_or(usize::MAX);
                    copy
                }
                Some(Keep::Targets(..)) => ring.copy_backward_live(&mut self.scratch),
                None => ring.copy_backward(),
            };
            copies.push((cpu, ring.clock(), copy));
        }
        if let Some(Keep::Targets(pid, of)) = only {
            // The targets are the processes with samples (the filter kept only theirs):
            // their other records stay, those of the rest of the machine go.
            let mut sampled = BTreeSet::from([pid]);
            for (_, _, copy) in &copies {
                sampled.extend(
                    records::records(&copy.data)
                        .filter(|r| r.kind == records::PERF_RECORD_SAMPLE)
                        .filter_map(|r| records::record_pid(self.params.sample_type, &r)),
                );
            }
            if let Some(of) = of {
                let mut allowed = of.clone();
                allowed.insert(pid);
                let allowed =
                    with_children(allowed, copies.iter().map(|(_, _, c)| c.data.as_slice()));
                sampled.retain(|p| allowed.contains(p));
            }
            for (_, _, copy) in &mut copies {
                let (kept, count) =
                    records::retain_processes(self.params.sample_type, &copy.data, |p| {
                        sampled.contains(&p)
                    });
                copy.data = kept;
                copy.records = usize::try_from(count).unwrap_or(usize::MAX);
            }
        }
        for (cpu, page_clock, copy) in copies {
            summary.add(self.params.sample_type, &copy.data);
            clock.get_or_insert(ClockConversion::anchored(page_clock, pair));
            rings.push(RingData {
                kind: RingKind::PerfRecords,
                cpu: Some(cpu),
                tid: None,
                wrapped: copy.stop == super::WalkStop::Wrapped,
                records: copy.records as u64,
                stop: Some(copy.stop),
                data: copy.data,
            });
        }
        let kernel_symbols = self.kallsyms.map_or_else(Vec::new, |kallsyms| {
            let layout = self.params.sample_layout();
            kallsyms.symbols_for(rings.iter().flat_map(|r| kernel_addresses(layout, &r.data)))
        });
        let pids: BTreeSet<u32> = match only {
            Some(Keep::Process(pid)) => BTreeSet::from([pid]),
            Some(Keep::Targets(pid, _)) => summary.pids.iter().copied().chain([pid]).collect(),
            None => self.pids.iter().chain(&summary.pids).copied().collect(),
        };
        let processes = self.collect_maps(&pids, &rings);
        let (code, perf_maps) = self.code_of(&processes);
        Ok(CapturedData {
            backend: Backend::Sampling,
            params: self.params.clone(),
            freeze_time_ns,
            pause_duration_ns,
            rings,
            sideband: Vec::new(),
            clock,
            processes,
            code,
            perf_maps,
            window: summary.first_time.zip(summary.last_time),
            kernel_symbols,
        })
    }

    /// The code of `processes` no file holds (read while they live) and the perf maps of
    /// the JIT runtimes among them (read now, else as last read while they lived).
    fn code_of(
        &self,
        processes: &[procmaps::ProcessMaps],
    ) -> (Vec<super::CodeRegion>, Vec<super::perf_map::PerfMap>) {
        let code = processes
            .iter()
            .filter(|p| p.at_freeze)
            .flat_map(|p| procmaps::read_code(p, self.embed_code))
            .collect();
        let perf_maps = processes
            .iter()
            .filter_map(|p| self.perf_maps.at_freeze(p))
            .collect();
        (code, perf_maps)
    }

    /// Sets BPF program `prog` on both events (a frozen process's switches are not
    /// recorded either).
    fn set_filter(&mut self, prog: BorrowedFd<'_>) -> Result<(), CaptureError> {
        let prog = prog
            .try_clone_to_owned()
            .map_err(|source| CaptureError::Syscall {
                what: "duplicating the sample filter's fd",
                source: crate::sys::SyscallError {
                    call: "fcntl(F_DUPFD_CLOEXEC)",
                    source,
                },
            })?;
        // Both events: a frozen process's switches are not recorded either.
        self.spec[1].bpf_prog = Some(prog.try_clone().map_err(|source| CaptureError::Syscall {
            what: "duplicating the sample filter's fd",
            source: crate::sys::SyscallError {
                call: "fcntl(F_DUPFD_CLOEXEC)",
                source,
            },
        })?);
        self.spec[0].bpf_prog = Some(prog);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PERF_RECORD_FORK` of `child` by `parent` at `time`.
    fn fork(child: u32, parent: u32, time: u64) -> Vec<u8> {
        let mut out = records::PERF_RECORD_FORK.to_le_bytes().to_vec();
        out.extend(0u16.to_le_bytes());
        out.extend(32u16.to_le_bytes());
        for word in [child, parent, child, parent] {
            out.extend(word.to_le_bytes());
        }
        out.extend(time.to_le_bytes());
        out
    }

    #[test]
    fn peers_take_the_children_the_rings_show_their_processes_fork() {
        // CPU 0: 10 forks 20 at t=5, 30 (not a peer) forks 31; CPU 1: 20 forks 21 at t=7
        // and, earlier, 21's pid was forked by 40 (t=1: another process, before reuse).
        let mut cpu0 = fork(20, 10, 5);
        cpu0.extend(fork(31, 30, 6));
        let mut cpu1 = fork(21, 40, 1);
        cpu1.extend(fork(21, 20, 7));
        cpu1.extend(fork(22, 21, 8));
        let peers = with_children(
            BTreeSet::from([10]),
            [cpu0.as_slice(), cpu1.as_slice()].into_iter(),
        );
        assert_eq!(peers, BTreeSet::from([10, 20, 21, 22]));
        // A grandchild whose fork the rings show before its parent's (records of two CPUs
        // read in time order, not ring by ring).
        let late = fork(51, 50, 9);
        let early = fork(50, 10, 2);
        let peers = with_children(
            BTreeSet::from([10]),
            [late.as_slice(), early.as_slice()].into_iter(),
        );
        assert_eq!(peers, BTreeSet::from([10, 50, 51]));
    }

    #[test]
    fn attr_asks_for_callchains_in_an_overwrite_ring() {
        let attr = sampling_attr(SamplingEvent::CpuClock, 10_000, false, 0);
        assert_eq!(attr.type_, PERF_TYPE_SOFTWARE);
        assert_eq!(attr.sample_type, sample_type(0, false));
        assert_ne!(attr.sample_type & SAMPLE_CALLCHAIN, 0);
        // SAFETY: both members of the union are `u64`; every bit pattern is valid.
        let freq = unsafe { attr.__bindgen_anon_1.sample_freq };
        assert_eq!(freq, 10_000);
        assert_eq!(
            (
                attr.freq(),
                attr.inherit(),
                attr.write_backward(),
                attr.exclude_callchain_kernel()
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(
            (attr.mmap2(), attr.comm(), attr.task(), attr.sample_id_all()),
            (1, 1, 1, 1)
        );
        assert_eq!(
            (attr.use_clockid(), attr.clockid),
            (1, libc::CLOCK_MONOTONIC)
        );
        let kernel = sampling_attr(SamplingEvent::Cycles, 0, true, 0);
        assert_eq!(
            (kernel.type_, kernel.exclude_callchain_kernel()),
            (PERF_TYPE_HARDWARE, 0)
        );
    }

    #[test]
    fn a_stack_size_asks_for_registers_and_stack_instead_of_user_callchains() {
        let attr = sampling_attr(SamplingEvent::CpuClock, 1000, false, 8192);
        assert_eq!(
            attr.sample_type & (SAMPLE_REGS_USER | SAMPLE_STACK_USER | SAMPLE_CALLCHAIN),
            SAMPLE_REGS_USER | SAMPLE_STACK_USER
        );
        assert_eq!(
            (attr.sample_regs_user, attr.sample_stack_user),
            (UNWIND_REGS, 8192)
        );
        assert_eq!(attr.exclude_callchain_user(), 1);
        // Kernel frames still come from the kernel's callchain.
        let kernel = sampling_attr(SamplingEvent::CpuClock, 1000, true, 8192);
        assert_ne!(kernel.sample_type & SAMPLE_CALLCHAIN, 0);
    }
}
