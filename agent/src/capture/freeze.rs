//! The freeze switch: stops a recorder's rings from any thread, without the recorder.
//!
//! The trigger pump (`triggers::pump`) runs on its own thread and freezes the recorder the
//! moment a trigger record arrives, before the async side even hears of it; the recorder's
//! own [`freeze`](super::Recorder::freeze) then finds its rings already stopped and takes
//! the switch's time as the freeze time. The switch holds duplicates of the ring fds, so it
//! never acts on a descriptor number that was closed and reused.
//!
//! Hot path ([`FreezeSwitch::freeze`]): one compare-and-swap, one ioctl per ring, one clock
//! read; no allocation and no lock (the PT follower list, which grows with threads, is the
//! exception: a mutex that only `add_process` also takes).
//!
//! State word: `0` running; [`FREEZING`] while a freeze is under way; any other value is
//! the `CLOCK_MONOTONIC` time the rings stopped. Only [`thaw`](FreezeSwitch::thaw) (the
//! recorder's resume) goes back to `0`, after un-pausing, so a freeze can never be marked
//! done on rings that run.

use std::{
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use super::CaptureError;
use crate::sys::{SyscallError, perf};

/// The state word while a freeze is in progress.
const FREEZING: u64 = u64::MAX;

/// How a recorder's rings are stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMethod {
    /// `PERF_EVENT_IOC_PAUSE_OUTPUT`: the events run, nothing is written (sampling).
    PauseOutput,
    /// `PERF_EVENT_IOC_DISABLE`: the AUX area ignores `PAUSE_OUTPUT` (Intel PT).
    Disable,
}

/// Stops (and restarts) one recorder's rings; shared between the recorder and the pump.
#[derive(Debug)]
pub struct FreezeSwitch {
    method: StopMethod,
    /// One slot per CPU ring (set once, when the ring is created).
    rings: Box<[OnceLock<OwnedFd>]>,
    /// Further events to stop (PT: one per traced thread and CPU).
    more: Mutex<Vec<OwnedFd>>,
    has_more: AtomicBool,
    state: AtomicU64,
    /// How long the last switch-side freeze took (ns).
    pause_ns: AtomicU64,
}

impl FreezeSwitch {
    /// A switch for up to `ring_slots` per-CPU rings.
    pub fn new(method: StopMethod, ring_slots: usize) -> Self {
        Self {
            method,
            rings: (0..ring_slots).map(|_| OnceLock::new()).collect(),
            more: Mutex::new(Vec::new()),
            has_more: AtomicBool::new(false),
            state: AtomicU64::new(0),
            pause_ns: AtomicU64::new(0),
        }
    }

    /// Registers the ring of slot `slot` (a duplicate of `fd` is kept).
    pub fn add_ring(&self, slot: usize, fd: BorrowedFd<'_>) -> Result<(), CaptureError> {
        let dup = duplicate(fd)?;
        if let Some(cell) = self.rings.get(slot) {
            let _ = cell.set(dup);
            return Ok(());
        }
        self.add_event_owned(dup);
        Ok(())
    }

    /// Registers one more event to stop (PT followers).
    pub fn add_event(&self, fd: BorrowedFd<'_>) -> Result<(), CaptureError> {
        let dup = duplicate(fd)?;
        self.add_event_owned(dup);
        Ok(())
    }

    fn add_event_owned(&self, fd: OwnedFd) {
        let mut more = self
            .more
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        more.push(fd);
        self.has_more.store(true, Ordering::Release);
    }

    /// Stops every registered ring now, unless they are stopped already. Returns the time
    /// the rings stopped (this freeze's, or the earlier one's). Errors of single ioctls are
    /// counted, not fatal: the recorder's own freeze stops the rings again and reports.
    pub fn freeze(&self) -> FreezeOutcome {
        if let Err(state) =
            self.state
                .compare_exchange(0, FREEZING, Ordering::AcqRel, Ordering::Acquire)
        {
            return FreezeOutcome {
                frozen_at_ns: self.wait_settled(state),
                already: true,
                failures: 0,
            };
        }
        let before = crate::sys::monotonic_ns();
        let (failures, _) = self.each(|fd| self.stop(fd, true));
        let at = crate::sys::monotonic_ns().clamp(1, FREEZING - 1);
        self.pause_ns
            .store(at.saturating_sub(before), Ordering::Relaxed);
        self.state.store(at, Ordering::Release);
        FreezeOutcome {
            frozen_at_ns: at,
            already: false,
            failures,
        }
    }

    /// The time the rings stopped, when they are stopped (waits out a freeze in progress).
    pub fn frozen_at(&self) -> Option<u64> {
        match self.wait_settled(self.state.load(Ordering::Acquire)) {
            0 => None,
            at => Some(at),
        }
    }

    /// How long the last switch-side freeze took (ns).
    pub fn pause_ns(&self) -> u64 {
        self.pause_ns.load(Ordering::Relaxed)
    }

    /// For a recorder's own freeze, which stopped the rings between `before` and `after`:
    /// the freeze time that holds (the pump's, when it stopped them first) and how long
    /// stopping took.
    pub fn settle(&self, before: u64, after: u64) -> (u64, u64) {
        let at = self.mark_frozen(after);
        let took = if at == after {
            after.saturating_sub(before)
        } else {
            self.pause_ns()
        };
        (at, took)
    }

    /// Marks the rings stopped at `at` when nothing stopped them yet (the recorder froze
    /// them itself); returns the time that holds.
    pub fn mark_frozen(&self, at: u64) -> u64 {
        let at = at.clamp(1, FREEZING - 1);
        match self
            .state
            .compare_exchange(0, at, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => at,
            Err(state) => self.wait_settled(state).max(1),
        }
    }

    /// Restarts every ring and marks the switch running. Returns the first failure.
    pub fn thaw(&self) -> Result<(), SyscallError> {
        self.frozen_at();
        let (_, first) = self.each(|fd| self.stop(fd, false));
        self.state.store(0, Ordering::Release);
        first.map_or(Ok(()), Err)
    }

    /// Stops (`true`) or restarts one event.
    fn stop(&self, fd: BorrowedFd<'_>, stop: bool) -> Result<(), SyscallError> {
        match (self.method, stop) {
            (StopMethod::PauseOutput, paused) => perf::pause_output(fd, paused),
            (StopMethod::Disable, true) => perf::disable(fd),
            (StopMethod::Disable, false) => perf::enable(fd),
        }
    }

    /// Runs `op` on every registered event; returns how many failed, and the first error.
    fn each(
        &self,
        op: impl Fn(BorrowedFd<'_>) -> Result<(), SyscallError>,
    ) -> (u32, Option<SyscallError>) {
        let (mut failures, mut first) = (0u32, None);
        let mut run = |fd: BorrowedFd<'_>| {
            if let Err(e) = op(fd) {
                failures += 1;
                first.get_or_insert(e);
            }
        };
        for fd in self.rings.iter().filter_map(OnceLock::get) {
            run(fd.as_fd());
        }
        if self.has_more.load(Ordering::Acquire) {
            let more = self
                .more
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for fd in more.iter() {
                run(fd.as_fd());
            }
        }
        (failures, first)
    }

    /// Spins while a freeze is in progress (a few ioctls long), then returns the state.
    fn wait_settled(&self, mut state: u64) -> u64 {
        while state == FREEZING {
            std::thread::yield_now();
            state = self.state.load(Ordering::Acquire);
        }
        state
    }
}

/// What [`FreezeSwitch::freeze`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreezeOutcome {
    /// `CLOCK_MONOTONIC` ns when the rings stopped.
    pub frozen_at_ns: u64,
    /// They were stopped before this call.
    pub already: bool,
    /// Events whose stop ioctl failed.
    pub failures: u32,
}

fn duplicate(fd: BorrowedFd<'_>) -> Result<OwnedFd, CaptureError> {
    fd.try_clone_to_owned()
        .map_err(|source| CaptureError::Syscall {
            what: "duplicating a ring descriptor for the freeze switch",
            source: SyscallError {
                call: "fcntl(F_DUPFD_CLOEXEC)",
                source,
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::sampling::sampling_attr;
    use crate::check::SamplingEvent;
    use crate::sys::perf::{Target, perf_event_open};

    fn cpu_clock() -> OwnedFd {
        let mut attr = sampling_attr(SamplingEvent::CpuClock, 1000, false, 0);
        attr.set_disabled(1);
        perf_event_open(&attr, Target::CurrentThread, None, None, 0).expect("cpu-clock opens")
    }

    #[test]
    fn freeze_once_then_report_the_first_time_until_thawed() {
        let switch = FreezeSwitch::new(StopMethod::Disable, 2);
        let a = cpu_clock();
        switch.add_ring(0, a.as_fd()).unwrap();
        // A slot beyond the table goes to the growable list.
        switch.add_ring(5, cpu_clock().as_fd()).unwrap();
        assert_eq!(switch.frozen_at(), None);
        let first = switch.freeze();
        assert!(!first.already);
        assert_eq!(first.failures, 0);
        assert!(first.frozen_at_ns > 0);
        let again = switch.freeze();
        assert!(again.already);
        assert_eq!(again.frozen_at_ns, first.frozen_at_ns);
        assert_eq!(switch.mark_frozen(u64::MAX), first.frozen_at_ns);
        assert_eq!(switch.frozen_at(), Some(first.frozen_at_ns));
        switch.thaw().unwrap();
        assert_eq!(switch.frozen_at(), None);
        assert_eq!(switch.mark_frozen(42), 42);
        assert_eq!(switch.freeze().frozen_at_ns, 42);
    }

    #[test]
    fn pause_output_needs_a_ring_and_failures_are_counted() {
        // PAUSE_OUTPUT on an event without a mapped ring fails (EINVAL): counted.
        let switch = FreezeSwitch::new(StopMethod::PauseOutput, 1);
        switch.add_ring(0, cpu_clock().as_fd()).unwrap();
        assert_eq!(switch.freeze().failures, 1);
        assert!(switch.thaw().is_err());
    }
}
