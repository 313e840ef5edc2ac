//! The watcher's looks at threads on a CPU: a `cpu-clock` perf event per online CPU,
//! every [`TICK_NS`], with the `inflight_tick` program attached (it fills a wanted look
//! and keeps no sample). Enabled only while the scan waits for such a look, so a machine
//! without slow calls in flight takes no tick.
//!
//! In: the tick program's descriptor. Out: [`Ticks::set`] turns them on and off.

use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};

use perf_event_open_sys::bindings::{PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_SOFTWARE};

use crate::sys::{
    SyscallError,
    perf::{self, Target, perf_event_attr},
};

/// How often a CPU looks at the thread on it while a look is wanted: the detection
/// period on CPU (with the scan's).
pub const TICK_NS: u64 = 5_000_000;

/// The per-CPU tick events.
pub(super) struct Ticks {
    events: Vec<OwnedFd>,
    on: bool,
}

impl Ticks {
    /// Opens one disabled tick per online CPU with `program` attached; a CPU whose event
    /// cannot be opened is logged and left out (its running threads are then looked at
    /// only when they leave it).
    pub(super) fn open(program: BorrowedFd<'_>) -> Self {
        let mut attr = perf_event_attr {
            type_: PERF_TYPE_SOFTWARE,
            config: u64::from(PERF_COUNT_SW_CPU_CLOCK),
            ..perf_event_attr::default()
        };
        attr.__bindgen_anon_1.sample_period = TICK_NS;
        attr.set_disabled(1);
        let cpus = crate::check::cpus::online_cpus().unwrap_or_default();
        let mut events = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            match open_one(&attr, cpu, program) {
                Ok(fd) => events.push(fd),
                Err(e) => log::warn!("in-flight looks on CPU {cpu} unavailable: {e}"),
            }
        }
        Self { events, on: false }
    }

    /// Turns the ticks on or off (nothing when already so).
    pub(super) fn set(&mut self, on: bool) {
        if on == self.on {
            return;
        }
        for fd in &self.events {
            let done = if on {
                perf::enable(fd.as_fd())
            } else {
                perf::disable(fd.as_fd())
            };
            if let Err(e) = done {
                log::debug!("in-flight tick: {e}");
            }
        }
        self.on = on;
    }
}

fn open_one(
    attr: &perf_event_attr,
    cpu: u32,
    program: BorrowedFd<'_>,
) -> Result<OwnedFd, SyscallError> {
    let fd = perf::perf_event_open(attr, Target::AllTasks, Some(cpu), None, 0)?;
    perf::set_bpf(fd.as_fd(), program)?;
    Ok(fd)
}
