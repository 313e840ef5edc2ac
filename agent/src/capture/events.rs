//! Which perf events a recorder opens: one per (traced thread, online CPU), `inherit = 1`,
//! and one ring per CPU that every event of that CPU writes into (`SET_OUTPUT`).
//!
//! perf refuses to `mmap` an inherited per-task event with `cpu = -1` (all children would
//! write into one buffer from every CPU), hence per-CPU events even for one thread. Threads
//! and processes created later by a traced thread inherit its events and write into the
//! same per-CPU rings; threads that already exist are found in `/proc/PID/task`. A spec
//! can instead join the group of an earlier spec's event of the same thread and CPU, with
//! no ring (PT's `aux_pause`/`aux_resume` members).

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
};

use super::CaptureError;
use crate::sys::perf::{self, Target, perf_event_attr};

/// A per-CPU ring that other events on the CPU redirect their output to.
pub(super) trait CpuRing {
    /// The event whose ring this is.
    fn output_fd(&self) -> BorrowedFd<'_>;
}

/// One perf event to open for every (thread, CPU).
pub(super) struct EventSpec {
    pub name: &'static str,
    pub attr: perf_event_attr,
    /// Set on every event opened from this spec (`PERF_EVENT_IOC_SET_FILTER`): Intel PT
    /// address filters, tracepoint filters.
    pub filter: Option<CString>,
    /// Set on every event opened from this spec (`PERF_EVENT_IOC_SET_BPF`): the sampling
    /// recorder's in-kernel freeze (`sample_filter`).
    pub bpf_prog: Option<OwnedFd>,
    /// Open each event in the group of spec N's event for the same thread and CPU (which
    /// comes earlier in the list), with no ring: a member whose overflow is what counts
    /// (PT's `aux_pause`/`aux_resume` events), not its records.
    pub group: Option<usize>,
    /// Memory `attr` points to (a uprobe's path), kept while the spec may be opened.
    #[expect(
        dead_code,
        reason = "never read: it owns what `attr.config1` points to"
    )]
    pub keep: Option<CString>,
}

/// The events of a recorder and its per-CPU rings.
pub(super) struct EventSet<R> {
    cpus: Vec<u32>,
    rings: BTreeMap<u32, R>,
    /// Every event that does not own a ring, with the index of its spec.
    followers: Vec<(usize, OwnedFd)>,
    tids: BTreeSet<u32>,
}

/// Where an event opened for the current thread and CPU went: a group member's leader is
/// looked up there.
#[derive(Debug, Clone, Copy)]
enum Opened {
    /// It became the CPU's ring.
    Ring,
    /// `followers[N]`.
    Follower(usize),
}

impl<R: CpuRing> EventSet<R> {
    pub fn new(cpus: Vec<u32>) -> Self {
        Self {
            cpus,
            rings: BTreeMap::new(),
            followers: Vec::new(),
            tids: BTreeSet::new(),
        }
    }

    /// The event at `loc`, opened for the thread and CPU being set up.
    fn event_at(&self, loc: Opened, cpu: u32) -> Option<BorrowedFd<'_>> {
        match loc {
            Opened::Ring => self.rings.get(&cpu).map(CpuRing::output_fd),
            Opened::Follower(at) => self.followers.get(at).map(|(_, fd)| fd.as_fd()),
        }
    }

    pub fn rings(&self) -> impl Iterator<Item = (u32, &R)> {
        self.rings.iter().map(|(&cpu, r)| (cpu, r))
    }

    pub fn rings_mut(&mut self) -> impl Iterator<Item = (u32, &mut R)> {
        self.rings.iter_mut().map(|(&cpu, r)| (cpu, r))
    }

    /// The follower events opened from spec `index` (ring owners are not included).
    pub fn followers_of(&self, index: usize) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.followers
            .iter()
            .filter(move |(i, _)| *i == index)
            .map(|(_, fd)| fd.as_fd())
    }

    /// Opens `specs` for `tid` on every CPU. The first spec's first event on a CPU becomes
    /// that CPU's ring (`make_ring`); every other event redirects its output there.
    /// A thread already traced is skipped; `Ok(false)` when the thread is gone.
    pub fn add_thread(
        &mut self,
        tid: u32,
        specs: &[EventSpec],
        make_ring: &mut dyn FnMut(OwnedFd, u32) -> Result<R, CaptureError>,
    ) -> Result<bool, CaptureError> {
        if self.tids.contains(&tid) {
            return Ok(true);
        }
        let pid = libc::pid_t::try_from(tid).map_err(|_| CaptureError::NoProcess { pid: tid })?;
        if !self.open_on_cpus(Target::Pid(pid), tid, specs, make_ring)? {
            return Ok(false);
        }
        self.tids.insert(tid);
        Ok(true)
    }

    /// Opens `specs` once per CPU for every task on it (`pid = -1`): the per-CPU recorder
    /// shared by all targets, whose events' BPF filter decides which samples are kept.
    /// Needs `CAP_PERFMON` (or `perf_event_paranoid` ≤ 0).
    pub fn add_cpu_wide(
        &mut self,
        specs: &[EventSpec],
        make_ring: &mut dyn FnMut(OwnedFd, u32) -> Result<R, CaptureError>,
    ) -> Result<(), CaptureError> {
        self.open_on_cpus(Target::AllTasks, 0, specs, make_ring)
            .map(|_| ())
    }

    /// Opens `specs` for `target` on every CPU (`tid`: for error messages); `Ok(false)`
    /// when the target thread is gone.
    fn open_on_cpus(
        &mut self,
        target: Target,
        tid: u32,
        specs: &[EventSpec],
        make_ring: &mut dyn FnMut(OwnedFd, u32) -> Result<R, CaptureError>,
    ) -> Result<bool, CaptureError> {
        let cpus = self.cpus.clone();
        for cpu in cpus {
            let mut opened: Vec<Option<Opened>> = vec![None; specs.len()];
            for (index, spec) in specs.iter().enumerate() {
                let leader = spec
                    .group
                    .and_then(|lead| opened.get(lead).copied().flatten())
                    .and_then(|loc| self.event_at(loc, cpu));
                if spec.group.is_some() && leader.is_none() {
                    return Err(CaptureError::Syscall {
                        what: "opening a group member before its leader",
                        source: crate::sys::SyscallError {
                            call: "perf_event_open",
                            source: std::io::Error::from_raw_os_error(libc::EINVAL),
                        },
                    });
                }
                let fd = match perf::perf_event_open(&spec.attr, target, Some(cpu), leader, 0) {
                    Ok(fd) => fd,
                    Err(err) if err.errno() == Some(libc::ESRCH) => return Ok(false),
                    Err(source) => {
                        return Err(CaptureError::Open {
                            event: spec.name,
                            tid,
                            cpu,
                            source,
                        });
                    }
                };
                if let Some(filter) = &spec.filter {
                    perf::set_filter(fd.as_fd(), filter).map_err(|source| {
                        CaptureError::Syscall {
                            what: "setting an event filter (PERF_EVENT_IOC_SET_FILTER)",
                            source,
                        }
                    })?;
                }
                if let Some(prog) = &spec.bpf_prog {
                    perf::set_bpf(fd.as_fd(), prog.as_fd()).map_err(|source| {
                        CaptureError::Syscall {
                            what: "setting the sample filter (PERF_EVENT_IOC_SET_BPF)",
                            source,
                        }
                    })?;
                }
                if index == 0 && !self.rings.contains_key(&cpu) {
                    let ring = make_ring(fd, cpu)?;
                    self.rings.insert(cpu, ring);
                    opened[index] = Some(Opened::Ring);
                    continue;
                }
                if spec.group.is_none() {
                    let Some(ring) = self.rings.get(&cpu) else {
                        // The ring owner is always opened first (index 0).
                        continue;
                    };
                    perf::set_output(fd.as_fd(), ring.output_fd()).map_err(|source| {
                        CaptureError::Syscall {
                            what: "redirecting an event into its CPU's ring",
                            source,
                        }
                    })?;
                }
                opened[index] = Some(Opened::Follower(self.followers.len()));
                self.followers.push((index, fd));
            }
        }
        Ok(true)
    }

    /// Opens `specs` for every thread of process `pid` (`/proc/PID/task`).
    pub fn add_process(
        &mut self,
        pid: u32,
        specs: &[EventSpec],
        make_ring: &mut dyn FnMut(OwnedFd, u32) -> Result<R, CaptureError>,
    ) -> Result<(), CaptureError> {
        let tids = threads_of(pid)?;
        let mut opened = 0usize;
        for tid in tids {
            if self.add_thread(tid, specs, make_ring)? {
                opened += 1;
            }
        }
        if opened == 0 {
            return Err(CaptureError::NoProcess { pid });
        }
        Ok(())
    }
}

/// The thread ids of `pid`, from `/proc/PID/task`.
pub(super) fn threads_of(pid: u32) -> Result<Vec<u32>, CaptureError> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            CaptureError::NoProcess { pid }
        } else {
            CaptureError::Io {
                path: dir.clone().into(),
                source,
            }
        }
    })?;
    let mut tids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The online CPUs ([`check::cpus::online_cpus`](crate::check::cpus::online_cpus)).
pub(super) fn online_cpus() -> Result<Vec<u32>, CaptureError> {
    crate::check::cpus::online_cpus().map_err(|source| CaptureError::Io {
        path: crate::check::cpus::ONLINE_CPUS.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's id (`/proc/thread-self` is `PID/task/TID`).
    fn this_tid() -> u32 {
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        link.file_name().unwrap().to_str().unwrap().parse().unwrap()
    }

    /// A CPU's ring for the tests (one data page: nothing is read from it).
    struct Bare(super::super::ring::PerfRing);

    impl CpuRing for Bare {
        fn output_fd(&self) -> BorrowedFd<'_> {
            self.0.fd()
        }
    }

    fn bare(fd: OwnedFd, _cpu: u32) -> Result<Bare, CaptureError> {
        super::super::ring::PerfRing::map(fd, 1, false).map(Bare)
    }

    fn software(config: u32) -> perf_event_attr {
        perf_event_attr {
            type_: perf_event_open_sys::bindings::PERF_TYPE_SOFTWARE,
            config: u64::from(config),
            ..perf_event_attr::default()
        }
    }

    /// How many events the group of `leader` has (`PERF_FORMAT_GROUP`: the first u64).
    fn group_size(leader: BorrowedFd<'_>) -> u64 {
        use std::io::Read as _;
        let mut file = std::fs::File::from(leader.try_clone_to_owned().unwrap());
        let mut buf = [0u8; 64];
        let n = file.read(&mut buf).unwrap();
        assert!(n >= 8, "read {n} bytes");
        u64::from_ne_bytes(buf[..8].try_into().unwrap())
    }

    #[test]
    fn group_members_join_their_leaders_event_on_each_thread_and_cpu() {
        use perf_event_open_sys::bindings::{
            PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_DUMMY, PERF_FORMAT_GROUP,
        };
        let mut leader = software(PERF_COUNT_SW_CPU_CLOCK);
        leader.read_format = u64::from(PERF_FORMAT_GROUP);
        let spec = |name, attr, group| EventSpec {
            name,
            attr,
            filter: None,
            bpf_prog: None,
            group,
            keep: None,
        };
        // The ring owner leads; the tracking-like event is redirected into the ring, not
        // grouped; two members join the leader of their own thread and CPU.
        let specs = [
            spec("leader", leader, None),
            spec("follower", software(PERF_COUNT_SW_DUMMY), None),
            spec("member", software(PERF_COUNT_SW_DUMMY), Some(0)),
            spec("member 2", software(PERF_COUNT_SW_CPU_CLOCK), Some(0)),
        ];
        let cpus = online_cpus().unwrap();
        let mut set = EventSet::<Bare>::new(cpus.clone());
        let mut make_ring = bare;
        // This thread first (its leaders own the rings), then a second one (its leaders
        // follow: the member must find them among the followers).
        let (park, parked) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            tid_tx.send(this_tid()).unwrap();
            let _ = parked.recv();
        });
        let other_tid = tid_rx.recv().unwrap();
        assert!(set.add_thread(this_tid(), &specs, &mut make_ring).unwrap());
        assert!(set.add_thread(other_tid, &specs, &mut make_ring).unwrap());
        let owners: Vec<u64> = set
            .rings()
            .map(|(_, ring)| group_size(ring.0.fd()))
            .collect();
        let followers: Vec<u64> = set.followers_of(0).map(group_size).collect();
        assert_eq!(owners, vec![3; cpus.len()]);
        assert_eq!(followers, vec![3; cpus.len()]);
        // Members are kept (closed with the set), apart from the redirected events.
        assert_eq!(set.followers_of(2).count(), 2 * cpus.len());
        assert_eq!(set.followers_of(1).count(), 2 * cpus.len());
        drop(park);
        other.join().unwrap();
    }

    #[test]
    fn a_member_before_its_leader_is_refused() {
        let specs = [EventSpec {
            name: "member",
            attr: software(perf_event_open_sys::bindings::PERF_COUNT_SW_DUMMY),
            filter: None,
            bpf_prog: None,
            group: Some(1),
            keep: None,
        }];
        let mut set = EventSet::<Bare>::new(online_cpus().unwrap());
        let mut make_ring = bare;
        assert!(matches!(
            set.add_thread(this_tid(), &specs, &mut make_ring),
            Err(CaptureError::Syscall { what, .. }) if what.contains("before its leader")
        ));
    }

    #[test]
    fn threads_of_self_and_of_nobody() {
        let me = std::process::id();
        assert!(threads_of(me).unwrap().contains(&me));
        assert!(matches!(
            threads_of(u32::MAX),
            Err(CaptureError::NoProcess { .. })
        ));
    }
}
