//! In-flight latency (`detect: running`): a thread that every [`SCAN_PERIOD`] finds the
//! calls that have run longer than their rule's threshold and are still running, proves
//! it, and fires them through the kernel's trigger engine.
//!
//! In: [`Handles`] (the kernel's `ENTRY_TIMES`, `SYSCALL_START`, looks and the fire
//! program). Out: trigger records on the usual ring (sent by `inflight_fire`, with the
//! cooldown, hourly limit and in-kernel freeze of every trigger), their stacks left in
//! [`crate::triggers::inflight::stacks`] for the pump, and [`Stats`].
//!
//! A syscall is in progress while its `SYSCALL_START` entry stands (`sys_exit` removes
//! it): the fire program checks that in the kernel. A function call is a candidate while
//! its entry frame is in `ENTRY_TIMES` (no exit probe removes it); it fires only when a
//! look at its thread taken after the threshold, unwound, still holds the function's frame
//! at the height it entered ([`proof::judge`]). Looks: a CPU tick while the thread runs
//! (every [`ticks::TICK_NS`], only while a look is wanted), the task iterator while it is
//! off CPU (in the scan).

mod goroutine;
mod proof;
mod scan;
mod ticks;

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::triggers::{engine::TriggerEngine, inflight::Handles};

pub use proof::{Proof, judge};
pub use ticks::TICK_NS;

/// How often the watcher scans: the detection period off CPU.
pub const SCAN_PERIOD: Duration = Duration::from_millis(10);

/// `SCHED_FIFO` priority of the watcher: below the trigger pump's 10.
const WATCHER_PRIORITY: i32 = 5;

/// What the watcher did, for logs and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls fired (the kernel may still suppress them: cooldown, hourly limit).
    pub fired: AtomicU64,
    /// Candidates a look showed had ended (a sibling's frame, SP above the call).
    pub refused: AtomicU64,
    /// Candidates whose look could not be unwound to the call's height.
    pub unproven: AtomicU64,
    /// Looks taken (by the task iterator or a sample).
    pub looks: AtomicU64,
}

/// The watcher's thread; stopped and joined on drop.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl Watcher {
    /// Starts scanning with `handles`.
    pub fn start(handles: Handles) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let (flag, counts) = (Arc::clone(&stop), Arc::clone(&stats));
        let thread = std::thread::Builder::new()
            .name("lookback-inflight".into())
            .spawn(move || {
                // Above the traced workload, below the trigger pump: a scan is bounded
                // work, and on a busy CPU a normal thread's scans came 20 ms late.
                if let Err(e) = crate::sys::thread::set_fifo_priority(WATCHER_PRIORITY) {
                    log::debug!("in-flight watcher stays a normal thread: {e}");
                }
                let mut scanner = scan::Scanner::new(handles, counts);
                while !flag.load(Ordering::Relaxed) {
                    scanner.scan();
                    std::thread::sleep(SCAN_PERIOD);
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// What it did so far.
    #[must_use]
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// Starts the watcher in `slot` once `engine` has a `detect: running` rule (the agent,
/// whose rules arrive and change while it runs); a failure is logged, and such rules then
/// never fire.
pub fn ensure_watcher(slot: &mut Option<Watcher>, engine: &TriggerEngine) {
    if slot.is_some() {
        return;
    }
    let Some(handles) = engine.inflight_handles() else {
        return;
    };
    match handles.map(Watcher::start) {
        Ok(Ok(watcher)) => *slot = Some(watcher),
        Ok(Err(e)) => log::error!("detect: running rules will not fire: {e}"),
        Err(e) => log::error!(
            "detect: running rules will not fire: {}",
            crate::sys::error_chain(&e)
        ),
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A look may wait on the target's memory (a stack page on a hung network
            // file system): lookback's own exit does not wait for it past a second.
            for _ in 0..100 {
                if thread.is_finished() {
                    let _ = thread.join();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let s = &self.stats;
        log::info!(
            "in-flight: {} call(s) fired, {} shown ended by a look (refused), {} unproven \
             (the look could not be unwound to the call), {} look(s)",
            s.fired.load(Ordering::Relaxed),
            s.refused.load(Ordering::Relaxed),
            s.unproven.load(Ordering::Relaxed),
            s.looks.load(Ordering::Relaxed),
        );
    }
}
