//! The Intel PT recorder: branch trace into an overwrite-mode AUX area per CPU, with a
//! sideband data ring (MMAP2, COMM, FORK/EXIT, SWITCH, `ITRACE_START`, AUX, LOST) fed by
//! the PT events and by a dummy tracking event, as `perf record -e intel_pt//` does.
//!
//! In: [`CaptureOptions`] (PT options packed by [`super::pt_config`] from the PMU's sysfs
//! `format/` and `caps/`). Out: per CPU, the AUX bytes oldest first ([`super::aux`]) and
//! the sideband records; the TSC conversion from the perf mmap page (`time_zero`,
//! `time_mult`, `time_shift`) plus a TSC/`CLOCK_MONOTONIC` pair taken at freeze.
//!
//! Freeze = `PERF_EVENT_IOC_DISABLE` on the PT events (it reaches inherited children), read
//! `aux_head`, copy, drain the sideband; resume = `PERF_EVENT_IOC_ENABLE`. The sideband
//! ring is a normal (consumed) ring: call [`Recorder::poll`] now and then so it never
//! fills. Triggers that map onto a perf event (`signal:`, `syscall:` and `func:` without a
//! duration;
//! [`super::aux_pause`]) also pause PT in the kernel at the event itself, from members of
//! each PT event's group (`aux_pause`, Linux 6.13), when the kernel takes them (tried at
//! open); the trigger pump still disables PT from userspace ([`super::freeze`]) for the
//! rest. `trace_binaries` become address filters ([`super::pt_filter`]).
//!
//! Never run on PT hardware: see docs/verification.md.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::Arc,
};

use perf_event_open_sys::bindings::{PERF_COUNT_SW_DUMMY, PERF_TYPE_SOFTWARE};

use super::{
    Backend, CaptureError, CaptureOptions, CapturedData, ClockConversion, EmbedCode, PeerSet,
    Recorder, RecorderParams, RingData, RingKind, SidebandData,
    aux::AuxArea,
    aux_pause,
    clock_history::ClockHistory,
    events::{CpuRing, EventSet, EventSpec, online_cpus},
    freeze::{FreezeSwitch, StopMethod},
    pages_for, procmaps,
    pt_config::{self, PtConfig},
    pt_filter, pt_timing,
    records::{self, SAMPLE_CPU, SAMPLE_IDENTIFIER, SAMPLE_TID, SAMPLE_TIME},
    ring::PerfRing,
};
use crate::{
    check::{PmuReadError, lock_budget, read_pmu, topa::AuxLimit},
    sys::{
        SyscallError,
        perf::{self, Target, perf_event_attr},
    },
};

/// The sample fields appended to every sideband record (`sample_id_all`).
pub const SIDEBAND_SAMPLE_TYPE: u64 = SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_IDENTIFIER;
/// Sideband data ring size per CPU.
const SIDEBAND_RING_BYTES: usize = 512 << 10;
/// Sideband kept per CPU between snapshots; beyond this the oldest records are dropped.
const SIDEBAND_RETAINED_BYTES: usize = 8 << 20;

/// One CPU's rings: the sideband data ring (owned by the first PT event on the CPU) and
/// its AUX area.
pub struct PtCpuRing {
    ring: PerfRing,
    aux: AuxArea,
    sideband: Vec<u8>,
    dropped_bytes: u64,
}

impl CpuRing for PtCpuRing {
    fn output_fd(&self) -> BorrowedFd<'_> {
        self.ring.fd()
    }
}

impl PtCpuRing {
    /// Maps the data ring (read-write) and the AUX area (read-only: overwrite mode) of
    /// `aux_size` bytes, or, where `limit` says the area is one contiguous allocation and
    /// the kernel refuses it with ENOMEM, of the largest half, quarter ... it takes
    /// (logged; the size obtained is `aux.size()`).
    fn map(
        fd: OwnedFd,
        data_pages: usize,
        aux_size: usize,
        limit: AuxLimit,
    ) -> Result<Self, CaptureError> {
        let page = crate::sys::page_size().ok_or(CaptureError::PageSize)?;
        let mut ring = PerfRing::map(fd, data_pages, false)?;
        let aux_offset = ((1 + data_pages) * page) as u64;
        let mut pages = aux_size / page;
        let aux = loop {
            if !ring.set_aux_area(aux_offset, (pages * page) as u64) {
                return Err(CaptureError::BadBufferSize {
                    bytes: pages * page,
                });
            }
            match AuxArea::map(ring.fd(), aux_offset, pages * page) {
                Ok(aux) => break aux,
                Err(CaptureError::Syscall { source, .. })
                    if source.errno() == Some(libc::ENOMEM)
                        && let Some(smaller) = limit.after_enomem(pages) =>
                {
                    log::warn!(
                        "intel_pt: no contiguous {} KiB for the AUX area (this CPU's ToPA \
                         holds one entry: the area is one physical block); trying {} KiB",
                        (pages * page) >> 10,
                        (smaller * page) >> 10
                    );
                    pages = smaller;
                }
                Err(err) => return Err(err),
            }
        };
        Ok(Self {
            ring,
            aux,
            sideband: Vec::new(),
            dropped_bytes: 0,
        })
    }

    /// Moves new sideband records out of the data ring, keeping at most
    /// [`SIDEBAND_RETAINED_BYTES`] (oldest dropped whole, counted).
    fn drain(&mut self) {
        let stop = self.ring.drain(&mut self.sideband);
        if let super::WalkStop::BadHeader { offset, size } = stop {
            log::warn!("intel_pt sideband: bad record header (size {size}) at {offset}");
        }
        if self.sideband.len() > SIDEBAND_RETAINED_BYTES {
            let mut cut = 0usize;
            for rec in records::records(&self.sideband) {
                cut += 8 + rec.body.len();
                if self.sideband.len() - cut <= SIDEBAND_RETAINED_BYTES / 2 {
                    break;
                }
            }
            self.sideband.drain(..cut);
            self.dropped_bytes += cut as u64;
        }
    }
}

/// The `aux_pause`/`aux_resume` members for the triggers in `opts.pt.pause_on`, each in
/// the group of the PT event (spec 0).
fn pause_specs(opts: &CaptureOptions) -> Vec<EventSpec> {
    if opts.pt.pause_on.is_empty() {
        return Vec::new();
    }
    let (members, notes) = aux_pause::members(&opts.pt.pause_on, &opts.event_sources);
    for note in notes {
        log::info!("intel_pt: no aux_pause for {note}; that trigger freezes from userspace");
    }
    members
        .into_iter()
        .map(|m| EventSpec {
            name: m.name,
            attr: m.attr,
            filter: m.filter,
            bpf_prog: None,
            group: Some(0),
            keep: m.keep,
        })
        .collect()
}

/// The AUX pages per CPU a PMU without multi-entry `ToPA` can map ([`AuxLimit::cap`]),
/// said loudly when that is fewer than asked for.
fn fit_topa(aux_pages: usize, limit: AuxLimit, page: usize) -> usize {
    let capped = limit.cap(aux_pages);
    if capped < aux_pages {
        log::warn!(
            "intel_pt: this CPU's ToPA holds one entry (caps/topa_multiple_entries = 0), so \
             the kernel needs the AUX area as one physical block of at most {} KiB: \
             recording into {} KiB per CPU instead of the {} KiB asked for",
            (capped * page) >> 10,
            (capped * page) >> 10,
            (aux_pages * page) >> 10
        );
    }
    capped
}

/// The AUX and data pages per CPU to map: those asked for, or smaller ones that fit what
/// this process may lock (an unprivileged user: [`lock_budget`]), said loudly.
fn fit_lock_budget(
    aux_pages: usize,
    data_pages: usize,
    cpus: usize,
    page: usize,
) -> Result<(usize, usize), CaptureError> {
    let budget = lock_budget::LockBudget::of_this_process(cpus);
    let Some(f) = lock_budget::fit(aux_pages, data_pages, cpus, page, budget) else {
        return Err(CaptureError::LockBudget {
            min_bytes: 5 * page,
            budget: budget.0.unwrap_or(0),
        });
    };
    if (f.aux_pages, f.data_pages) != (aux_pages, data_pages) {
        log::warn!(
            "intel_pt: {} KiB of AUX + {} KiB of sideband per CPU on {cpus} CPUs exceed the \
             {} KiB this process may lock (perf_event_mlock_kb × CPUs + RLIMIT_MEMLOCK, \
             without CAP_IPC_LOCK): recording into {} KiB + {} KiB per CPU, a shorter \
             history; grant CAP_IPC_LOCK (or raise the limits) for the size asked",
            (aux_pages * page) >> 10,
            (data_pages * page) >> 10,
            budget.0.unwrap_or(0) >> 10,
            (f.aux_pages * page) >> 10,
            (f.data_pages * page) >> 10,
        );
    }
    Ok((f.aux_pages, f.data_pages))
}

/// The `aux_pause` members for `opts` that the kernel takes in a group led by `pt` on
/// `cpu`, each tried on its own ([`aux_pause::accepted`]); the refused ones are logged.
fn taken_pause_specs(
    opts: &CaptureOptions,
    pt: &perf_event_attr,
    cpu: Option<u32>,
) -> Vec<EventSpec> {
    let mut pause = pause_specs(opts);
    if let (false, Some(cpu)) = (pause.is_empty(), cpu) {
        // Each member on its own: one the kernel refuses costs only its trigger.
        let taken = aux_pause::accepted(
            pause,
            |m| aux_pause::is_resume(&m.attr),
            |group| kernel_takes_members(pt, group, cpu),
        );
        for (member, err) in &taken.refused {
            log::warn!(
                "intel_pt: the kernel refused the {} group member ({err}): needs Linux \
                 6.13+ and a PT PMU that can pause (a uprobe member: CAP_SYS_ADMIN); \
                 its trigger freezes from userspace",
                member.name
            );
        }
        pause = taken.kept;
    }
    if !pause.is_empty() {
        log::info!(
            "intel_pt: {} trigger(s) pause the trace in the kernel (aux_pause)",
            pause.len() - 1
        );
    }
    pause
}

/// Whether the kernel takes `members` in a group led by `pt` (tried on the calling thread
/// and `cpu`, closed right away): a kernel before 6.13 rejects `aux_action` (`EINVAL`), a
/// PT PMU that cannot pause rejects the members (`EOPNOTSUPP`/`EINVAL`), a uprobe member
/// without `CAP_SYS_ADMIN` is refused (`EACCES`/`EPERM`).
fn kernel_takes_members(
    pt: &perf_event_attr,
    members: &[&EventSpec],
    cpu: u32,
) -> Result<(), SyscallError> {
    let mut leader_attr = *pt;
    leader_attr.set_inherit(0);
    let leader = perf::perf_event_open(&leader_attr, Target::CurrentThread, Some(cpu), None, 0)?;
    let mut open = Vec::new();
    for member in members {
        let mut attr = member.attr;
        attr.set_inherit(0);
        open.push(perf::perf_event_open(
            &attr,
            Target::CurrentThread,
            Some(cpu),
            Some(leader.as_fd()),
            0,
        )?);
    }
    Ok(())
}

/// The PT event's attr. Opened disabled and enabled once its AUX area is mapped
/// ([`PtRecorder::add_process`]): an event enabled at open is scheduled in before the
/// mmap, `pt_event_start` finds no AUX buffer and leaves it stopped until the task's next
/// context switch, so a busy target that keeps its CPU was not traced at all.
fn pt_attr(cfg: &PtConfig, include_kernel: bool) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_: cfg.pmu_type,
        config: cfg.config,
        sample_type: SIDEBAND_SAMPLE_TYPE,
        ..perf_event_attr::default()
    };
    attr.set_disabled(1);
    attr.set_inherit(1);
    attr.set_sample_id_all(1);
    attr.set_exclude_kernel(u64::from(!include_kernel));
    attr.set_exclude_hv(1);
    attr
}

/// The tracking event perf adds next to PT: maps, comms, tasks and context switches.
fn tracking_attr(include_kernel: bool) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_: PERF_TYPE_SOFTWARE,
        config: u64::from(PERF_COUNT_SW_DUMMY),
        sample_type: SIDEBAND_SAMPLE_TYPE,
        ..perf_event_attr::default()
    };
    attr.set_inherit(1);
    attr.set_sample_id_all(1);
    attr.set_exclude_kernel(u64::from(!include_kernel));
    attr.set_exclude_hv(1);
    attr.set_mmap(1);
    attr.set_mmap2(1);
    attr.set_comm(1);
    attr.set_comm_exec(1);
    attr.set_task(1);
    attr.set_context_switch(1);
    attr
}

/// Intel PT into per-CPU overwrite AUX areas.
pub struct PtRecorder {
    events: EventSet<PtCpuRing>,
    /// The PT event (index 0: leader and ring owner), the tracking event, then the
    /// `aux_pause`/`aux_resume` members of the PT event's group, if any.
    specs: Vec<EventSpec>,
    data_pages: usize,
    aux_size: usize,
    /// Clock pairs read at each poll, for the rate between TSC and `CLOCK_MONOTONIC`.
    clock_history: ClockHistory,
    /// How the kernel can allocate the AUX areas (one block each without multi-entry `ToPA`).
    aux_limit: AuxLimit,
    params: RecorderParams,
    embed_code: EmbedCode,
    pids: BTreeSet<u32>,
    known_maps: BTreeMap<u32, procmaps::ProcessMaps>,
    disabled: bool,
    /// Disables the PT events from the trigger pump's thread (AUX ignores `PAUSE_OUTPUT`).
    switch: Arc<FreezeSwitch>,
    /// PT follower events already registered with `switch`.
    switch_followers: usize,
    /// One PT event per CPU for every process ([`Self::open_cpu_wide`]): a process is
    /// only a set of maps to keep for its snapshots.
    cpu_wide: bool,
}

impl PtRecorder {
    /// Reads the `intel_pt` PMU from `opts.event_sources`, packs the config. Fails with
    /// [`CaptureError::IntelPtNotFound`] where there is no PT (VMs, AMD, ARM).
    pub fn open(opts: &CaptureOptions) -> Result<Self, CaptureError> {
        let pmu = read_pmu(&opts.event_sources, "intel_pt").map_err(|err| match err {
            PmuReadError::NotFound { dir } => CaptureError::IntelPtNotFound { dir },
            PmuReadError::Io { dir, source } => CaptureError::Io { path: dir, source },
        })?;
        let cfg = pt_config::pack(&pmu, &opts.pt)?;
        let caps = crate::check::IntelPtCaps::from_pmu(&pmu);
        let filter = pt_filter::build(
            &opts.pt.trace_binaries,
            caps.nr_addr_filters,
            caps.ip_filtering,
        )?;
        if let Some(f) = &filter {
            log::info!("intel_pt: address filter {}", f.to_string_lossy());
        }
        for note in &cfg.notes {
            log::info!("intel_pt: {note}");
        }
        let page = crate::sys::page_size().ok_or(CaptureError::PageSize)?;
        let cpus = online_cpus()?;
        let limit = AuxLimit::of_this_kernel(caps.topa_multiple_entries);
        let (aux_pages, data_pages) = fit_lock_budget(
            fit_topa(pages_for(opts.buffer_size)?, limit, page),
            pages_for(SIDEBAND_RING_BYTES)?,
            cpus.len(),
            page,
        )?;
        let pt = pt_attr(&cfg, opts.include_kernel);
        let pause = taken_pause_specs(opts, &pt, cpus.first().copied());
        let params = RecorderParams {
            event: "intel_pt".to_owned(),
            perf_type: cfg.pmu_type,
            config: cfg.config,
            config_fields: cfg.fields.clone(),
            sample_type: SIDEBAND_SAMPLE_TYPE,
            sample_regs_user: 0,
            sample_stack_user: 0,
            switch_ids: Vec::new(),
            sample_id_all: true,
            sample_frequency: None,
            buffer_size: (aux_pages * page) as u64,
            include_kernel: opts.include_kernel,
            clockid: None,
            cpus: cpus.clone(),
            aux_pause: !pause.is_empty(),
            address_filter: filter.as_ref().map(|f| f.to_string_lossy().into_owned()),
            pt_timing: Some(pt_timing::PtTiming::read(
                &pmu.dir,
                &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
            )),
            cpu_wide: false,
        };
        Ok(Self {
            switch: Arc::new(FreezeSwitch::new(StopMethod::Disable, cpus.len())),
            switch_followers: 0,
            events: EventSet::new(cpus),
            specs: [
                EventSpec {
                    name: "intel_pt",
                    attr: pt,
                    filter,
                    bpf_prog: None,
                    group: None,
                    keep: None,
                },
                EventSpec {
                    name: "dummy (tracking)",
                    attr: tracking_attr(opts.include_kernel),
                    filter: None,
                    bpf_prog: None,
                    group: None,
                    keep: None,
                },
            ]
            .into_iter()
            .chain(pause)
            .collect(),
            data_pages,
            aux_size: aux_pages * page,
            aux_limit: limit,
            clock_history: ClockHistory::default(),
            params,
            embed_code: opts.embed_code,
            pids: BTreeSet::new(),
            known_maps: BTreeMap::new(),
            disabled: false,
            cpu_wide: false,
        })
    }

    /// The Intel PT recorder shared by every Intel PT target of the agent's rules: one PT
    /// event and one tracking event per CPU for every task (`pid = -1`), so memory is
    /// CPUs × (`buffer_size` + sideband ring) and fds 2 × CPUs, whatever the number of
    /// targets, and a process is traced from its first instruction with no work here.
    ///
    /// Why every process and not only the targets: PT has no sample to filter, and the
    /// kernel runs at most one PT event per CPU (`PERF_PMU_CAP_EXCLUSIVE`: a cgroup event
    /// per container would refuse the second container). The rings hold every process's
    /// user-space flow; a snapshot keeps the triggering process's maps and code (and its
    /// peers'), the sideband's context switches of all, and the decode keeps only the
    /// tracks of those processes. The trade-off: a CPU's ring is shared, so busy
    /// neighbours shorten a target's window (a larger `buffer_size`, or
    /// `capture.isolate: true` for rings per process, which then every Intel PT rule
    /// gets: the kernel refuses per-process PT events next to per-CPU ones).
    ///
    /// Fails with [`CaptureError::CpuWideFilter`] when `trace_binaries` is set: the kernel
    /// takes no file-backed address filter on an event that follows a CPU.
    pub fn open_cpu_wide(opts: &CaptureOptions) -> Result<Self, CaptureError> {
        if !opts.pt.trace_binaries.is_empty() {
            return Err(CaptureError::CpuWideFilter);
        }
        let mut recorder = Self::open(opts)?;
        recorder.make_cpu_wide();
        recorder.open_rings(None)?;
        Ok(recorder)
    }

    /// The specs of a recorder that follows CPUs: no inheritance (it means nothing
    /// there) and no `aux_pause` members (they would be CPU-wide uprobes and
    /// tracepoints of every process; the trigger pump's disable freezes instead).
    fn make_cpu_wide(&mut self) {
        self.cpu_wide = true;
        self.params.cpu_wide = true;
        self.specs.truncate(2);
        self.params.aux_pause = false;
        for spec in &mut self.specs {
            spec.attr.set_inherit(0);
        }
    }

    /// Opens the events of `pid` (every task: `None`) on every CPU, maps the new rings,
    /// registers them with the freeze switch and enables PT unless frozen.
    fn open_rings(&mut self, pid: Option<u32>) -> Result<(), CaptureError> {
        let (data_pages, limit) = (self.data_pages, self.aux_limit);
        let mut aux_size = self.aux_size;
        let switch = &self.switch;
        let cpus = self.params.cpus.clone();
        let mut make_ring = |fd: OwnedFd, cpu: u32| {
            let ring = PtCpuRing::map(fd, data_pages, aux_size, limit)?;
            // A size the kernel refused once is not asked for again.
            aux_size = aux_size.min(ring.aux.size());
            let slot = cpus.iter().position(|&c| c == cpu).unwrap_or(usize::MAX);
            switch.add_ring(slot, ring.ring.fd())?;
            Ok(ring)
        };
        let added = match pid {
            Some(pid) => self.events.add_process(pid, &self.specs, &mut make_ring),
            None => self.events.add_cpu_wide(&self.specs, &mut make_ring),
        };
        if aux_size < self.aux_size {
            self.aux_size = aux_size;
            self.params.buffer_size = aux_size as u64;
        }
        added?;
        for fd in self.events.followers_of(0).skip(self.switch_followers) {
            self.switch.add_event(fd)?;
            self.switch_followers += 1;
        }
        // Opened disabled (`pt_attr`): on now that the AUX areas exist, unless frozen.
        if !self.disabled && self.switch.frozen_at().is_none() {
            self.set_enabled(true)?;
        }
        Ok(())
    }

    /// Every PT event: the ring owners and the PT followers (not the tracking events).
    fn set_enabled(&mut self, enabled: bool) -> Result<(), CaptureError> {
        let owners: Vec<BorrowedFd<'_>> = self.events.rings().map(|(_, r)| r.ring.fd()).collect();
        for fd in owners.into_iter().chain(self.events.followers_of(0)) {
            let result = if enabled {
                perf::enable(fd)
            } else {
                perf::disable(fd)
            };
            result.map_err(|source| CaptureError::Syscall {
                what: if enabled {
                    "enabling Intel PT"
                } else {
                    "disabling Intel PT"
                },
                source,
            })?;
        }
        Ok(())
    }

    /// The maps of `pids`, read now, or as last read for a process gone since.
    fn collect_maps(&mut self, pids: &BTreeSet<u32>) -> Vec<procmaps::ProcessMaps> {
        let now = super::monotonic_ns();
        let mut out = Vec::new();
        for &pid in pids {
            match procmaps::read_process(pid, now) {
                Ok(maps) => {
                    self.known_maps.insert(pid, maps.clone());
                    out.push(maps);
                }
                Err(_) => out.extend(self.known_maps.get(&pid).map(|m| procmaps::ProcessMaps {
                    at_freeze: false,
                    ..m.clone()
                })),
            }
        }
        out
    }
}

impl PtRecorder {
    /// Stops PT and copies every CPU's rings, with the maps and code of `keep` (a CPU-wide
    /// recorder's sideband cut down to what their decode needs: [`cut_sideband`]).
    fn freeze_keeping(&mut self, keep: &BTreeSet<u32>) -> Result<CapturedData, CaptureError> {
        let cpu_wide = self.cpu_wide;
        let before = super::monotonic_ns();
        self.set_enabled(false)?;
        self.disabled = true;
        let after = super::monotonic_ns();
        // The pump may have stopped the rings at the trigger already: that moment counts.
        let (freeze_time_ns, pause_duration_ns) = self.switch.settle(before, after);
        let pair = super::ClockPair::now();
        let (mut rings, mut sideband, mut clock) = (Vec::new(), Vec::new(), None);
        for (cpu, r) in self.events.rings_mut() {
            let head = r.ring.aux_head();
            let copy = r.aux.copy(head);
            r.drain();
            let page = r.ring.clock();
            clock.get_or_insert(
                ClockConversion::anchored(page, pair).with_earlier(self.clock_history.before(pair)),
            );
            rings.push(RingData {
                kind: RingKind::Aux,
                cpu: Some(cpu),
                tid: None,
                wrapped: copy.wrapped,
                records: 0,
                stop: None,
                data: copy.data,
            });
            sideband.push(SidebandData {
                cpu: Some(cpu),
                dropped_bytes: r.dropped_bytes,
                data: if cpu_wide {
                    cut_sideband(&r.sideband, keep)
                } else {
                    r.sideband.clone()
                },
            });
        }
        let processes = self.collect_maps(keep);
        let code = processes
            .iter()
            .filter(|p| p.at_freeze)
            .flat_map(|p| procmaps::read_code(p, self.embed_code))
            .collect();
        let perf_maps = processes
            .iter()
            .filter(|p| p.at_freeze)
            .filter_map(super::perf_map::capture)
            .collect();
        Ok(CapturedData {
            backend: Backend::IntelPt,
            params: self.params.clone(),
            freeze_time_ns,
            pause_duration_ns,
            rings,
            sideband,
            clock,
            processes,
            code,
            perf_maps,
            window: None,
            kernel_symbols: Vec::new(),
        })
    }
}

/// The sideband records a snapshot of `keep` needs from a CPU-wide ring: every context
/// switch (they say when *other* processes ran, whose trace the decode then drops) and
/// records of no process, plus everything of the kept processes; the other processes'
/// maps, names and forks are dropped.
fn cut_sideband(stream: &[u8], keep: &BTreeSet<u32>) -> Vec<u8> {
    records::retain_records(stream, |record| {
        matches!(
            record.kind,
            records::PERF_RECORD_SWITCH | records::PERF_RECORD_SWITCH_CPU_WIDE
        ) || records::record_pid(SIDEBAND_SAMPLE_TYPE, record).is_none_or(|p| keep.contains(&p))
    })
    .0
}

impl Recorder for PtRecorder {
    fn backend(&self) -> Backend {
        Backend::IntelPt
    }

    fn params(&self) -> &RecorderParams {
        &self.params
    }

    fn add_process(&mut self, pid: u32) -> Result<(), CaptureError> {
        if self.cpu_wide {
            // Already traced (every process is): only its maps, kept in case it is gone
            // by the freeze of its snapshot.
            let maps = procmaps::read_target(pid)?;
            self.known_maps.insert(pid, maps);
            self.pids.insert(pid);
            return Ok(());
        }
        self.open_rings(Some(pid))?;
        if let Ok(maps) = procmaps::read_process(pid, super::monotonic_ns()) {
            self.known_maps.insert(pid, maps);
        }
        self.pids.insert(pid);
        Ok(())
    }

    fn poll(&mut self) -> Result<(), CaptureError> {
        for (_, cpu_ring) in self.events.rings_mut() {
            cpu_ring.drain();
        }
        self.clock_history.observe(super::ClockPair::now());
        Ok(())
    }

    fn freeze(&mut self) -> Result<CapturedData, CaptureError> {
        let pids = self.pids.clone();
        self.freeze_keeping(&pids)
    }

    fn freeze_for(&mut self, pid: u32, peers: &PeerSet) -> Result<CapturedData, CaptureError> {
        if !self.cpu_wide {
            return self.freeze();
        }
        let keep = match peers {
            PeerSet::None => BTreeSet::from([pid]),
            PeerSet::Of(set) => set.iter().copied().chain([pid]).collect(),
            PeerSet::All => self.pids.iter().copied().chain([pid]).collect(),
        };
        self.freeze_keeping(&keep)
    }

    fn remove_process(&mut self, pid: u32) {
        if self.cpu_wide {
            self.pids.remove(&pid);
            self.known_maps.remove(&pid);
        }
    }

    fn resume(&mut self) -> Result<(), CaptureError> {
        if self.disabled || self.switch.frozen_at().is_some() {
            self.set_enabled(true)?;
            self.disabled = false;
        }
        // Every event the switch knows is one `set_enabled` just enabled: this only marks
        // it running again.
        self.switch.thaw().map_err(|source| CaptureError::Syscall {
            what: "enabling Intel PT",
            source,
        })
    }

    fn freeze_switch(&self) -> Option<Arc<FreezeSwitch>> {
        Some(Arc::clone(&self.switch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::PtOptions;

    #[test]
    fn attrs_follow_the_packed_config() {
        let cfg = PtConfig {
            pmu_type: 8,
            config: 0x2401,
            fields: BTreeMap::new(),
            notes: Vec::new(),
        };
        let attr = pt_attr(&cfg, false);
        assert_eq!((attr.type_, attr.config), (8, 0x2401));
        assert_eq!(
            (attr.inherit(), attr.sample_id_all(), attr.exclude_kernel()),
            (1, 1, 1)
        );
        assert_eq!(attr.aux_start_paused_bits(), 0);
        let tracking = tracking_attr(true);
        assert_eq!(tracking.config, u64::from(PERF_COUNT_SW_DUMMY));
        assert_eq!(
            (
                tracking.mmap2(),
                tracking.comm(),
                tracking.task(),
                tracking.context_switch()
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(tracking.exclude_kernel(), 0);
    }

    trait AuxBits {
        fn aux_start_paused_bits(&self) -> u32;
    }

    impl AuxBits for perf_event_attr {
        fn aux_start_paused_bits(&self) -> u32 {
            // SAFETY: `aux_action` and its bitfield view are both a plain u32.
            unsafe { self.__bindgen_anon_5.aux_action }
        }
    }

    #[test]
    fn pause_members_join_the_pt_events_group() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        let event = sys.join("kernel/tracing/events/signal/signal_deliver");
        std::fs::create_dir_all(&event).unwrap();
        std::fs::write(event.join("id"), "181\n").unwrap();
        let mut opts = CaptureOptions {
            event_sources: sys.join("bus/event_source/devices"),
            ..CaptureOptions::default()
        };
        assert!(pause_specs(&opts).is_empty());
        opts.pt.pause_on = vec![aux_pause::PauseSource::Tracepoint {
            system: "signal",
            name: "signal_deliver",
            filter: Some("sig == 11".to_owned()),
        }];
        let specs = pause_specs(&opts);
        let shape: Vec<(&str, Option<usize>, u64)> = specs
            .iter()
            .map(|s| (s.name, s.group, s.attr.config))
            .collect();
        assert_eq!(
            shape,
            [
                ("aux_pause (tracepoint)", Some(0), 181),
                ("aux_resume (cpu-clock)", Some(0), 0),
            ]
        );
        assert_eq!(specs[0].filter.as_deref(), Some(c"sig == 11"));
    }

    #[test]
    fn the_pt_event_opens_disabled_and_inherited() {
        let cfg = PtConfig {
            pmu_type: 8,
            config: 1,
            fields: BTreeMap::new(),
            notes: Vec::new(),
        };
        let attr = pt_attr(&cfg, false);
        assert_eq!(
            (attr.disabled(), attr.inherit(), attr.exclude_kernel()),
            (1, 1, 1)
        );
    }

    #[test]
    fn without_multi_entry_topa_the_aux_area_is_one_largest_block() {
        let root = tempfile::tempdir().unwrap();
        let dir = crate::check::write_intel_pt_fixture(root.path());
        let opts = CaptureOptions {
            event_sources: root.path().to_owned(),
            buffer_size: 16 << 20,
            ..CaptureOptions::default()
        };
        let page = crate::sys::page_size().unwrap();
        let asked = PtRecorder::open(&opts).unwrap();
        assert_eq!(asked.aux_size, 16 << 20);
        std::fs::write(dir.join("caps/topa_multiple_entries"), "0\n").unwrap();
        let single = PtRecorder::open(&opts).unwrap();
        // 2^MAX_PAGE_ORDER pages (this kernel's /proc/buddyinfo), what rb_alloc_aux can
        // hand out as one block; 4 MiB on x86-64.
        let max_order = AuxLimit::new(
            Some(false),
            &std::fs::read_to_string("/proc/buddyinfo").unwrap_or_default(),
        )
        .max_order;
        assert_eq!(single.aux_size, page << max_order);
        assert_eq!(single.params.buffer_size, (page << max_order) as u64);
        assert!(single.aux_limit.single_chunk && !asked.aux_limit.single_chunk);
    }

    #[test]
    fn the_per_cpu_recorder_follows_cpus_without_filters_or_inheritance() {
        let root = tempfile::tempdir().unwrap();
        crate::check::write_intel_pt_fixture(root.path());
        let opts = CaptureOptions {
            event_sources: root.path().to_owned(),
            ..CaptureOptions::default()
        };
        let mut recorder = PtRecorder::open(&opts).unwrap();
        assert!(recorder.specs.iter().all(|s| s.attr.inherit() == 1));
        recorder.make_cpu_wide();
        assert!(recorder.cpu_wide && recorder.params.cpu_wide && !recorder.params.aux_pause);
        assert_eq!(
            recorder.specs.len(),
            2,
            "the PT and the tracking event only"
        );
        assert!(recorder.specs.iter().all(|s| s.attr.inherit() == 0));
        assert_eq!(
            recorder.specs[1].attr.context_switch(),
            1,
            "SWITCH_CPU_WIDE records"
        );
        // The kernel takes no file address filter on a CPU-wide event: refused before any
        // event is opened.
        let filtered = CaptureOptions {
            pt: PtOptions {
                trace_binaries: vec!["/bin/true".into()],
                ..PtOptions::default()
            },
            ..opts.clone()
        };
        assert!(matches!(
            PtRecorder::open_cpu_wide(&filtered),
            Err(CaptureError::CpuWideFilter)
        ));
        // Here (no PT) the fixture's PMU type opens nothing: an error, not a recorder.
        assert!(PtRecorder::open_cpu_wide(&opts).is_err());
    }

    #[test]
    fn a_per_cpu_sideband_keeps_every_switch_and_only_the_kept_processes_records() {
        use crate::test_support::{sideband_record, thread_start_records};
        let mut stream = thread_start_records(10, 11, "ours", 1, 0);
        stream.extend(thread_start_records(20, 21, "theirs", 2, 0));
        let switch_out = sideband_record(15, 1 << 13, &[20, 0, 0, 0, 21, 0, 0, 0], (10, 11), 3, 0);
        let switch_in = sideband_record(15, 0, &[10, 0, 0, 0, 11, 0, 0, 0], (20, 21), 3, 0);
        stream.extend(&switch_out);
        stream.extend(&switch_in);
        let cut = cut_sideband(&stream, &BTreeSet::from([10]));
        let mut expected = thread_start_records(10, 11, "ours", 1, 0);
        expected.extend(switch_out);
        expected.extend(switch_in);
        assert_eq!(cut, expected);
    }

    #[test]
    fn open_fails_cleanly_without_the_pmu() {
        let root = tempfile::tempdir().unwrap();
        let opts = CaptureOptions {
            event_sources: root.path().to_owned(),
            pt: PtOptions::default(),
            ..CaptureOptions::default()
        };
        let Err(err) = PtRecorder::open(&opts) else {
            panic!("opened intel_pt in an empty tempdir");
        };
        assert!(matches!(err, CaptureError::IntelPtNotFound { .. }), "{err}");
    }
}
