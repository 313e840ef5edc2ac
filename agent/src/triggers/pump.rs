//! The trigger pump: a dedicated thread blocked in `poll` on the trigger ring buffer alone,
//! which runs a freeze hook on each record the moment it arrives and only then hands the
//! decoded events to the async side.
//!
//! Why a thread: through tokio, a trigger waited for the runtime's epoll, its task queue and
//! whatever the event loop was doing (writing the previous snapshot, polling recorders);
//! on a loaded 2-vCPU VM that was 54 µs at p50 and 300 µs at p99 before the rings stopped.
//! Here the wakeup goes straight to a thread that does nothing else, in `SCHED_FIFO` when
//! allowed (it then preempts the traced workload on a busy CPU), and the hook (typically
//! [`FreezeSwitch::freeze`](crate::capture::freeze::FreezeSwitch::freeze)) runs before any
//! allocation: the record is copied to the stack, the hook sees it, and only then is the
//! owned [`TriggerEvent`] built and sent.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use lookback_common::trigger::{PHASE_RUNNING, TriggerRecord, record_rules};
use tokio::sync::mpsc;

use super::event::{
    TriggerEvent, kernel_stack_frames, record_from_bytes, stack_copy_from_bytes, stack_frames,
    stack_from_bytes,
};
use crate::sys::{SyscallError, thread};

/// Runs on the pump thread for every trigger record, before it is decoded or sent.
pub type FreezeHook = Box<dyn FnMut(&TriggerRecord) + Send>;

/// How the pump thread waits for the next trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Sleeps in `poll` (in `SCHED_FIFO` when allowed): no CPU while idle, but each trigger
    /// waits for a scheduler wakeup (tens of µs in a VM).
    #[default]
    Sleep,
    /// Spins on the ring, a normal-priority thread busy on one CPU for the whole session:
    /// the freeze follows the kernel's submit within a few µs. For a short, targeted
    /// recording (`lookback run --freeze-spin`), not a daemon.
    Spin,
}

/// `SCHED_FIFO` priority of the pump thread: above every normal task, below the kernel's
/// own RT threads (which use 50 and up).
const PUMP_PRIORITY: i32 = 10;

/// How long [`TriggerPump::drain`] waits for the thread to finish a pass.
const DRAIN_WAIT: Duration = Duration::from_millis(500);

/// Why the pump could not start.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("creating the pump's wakeup eventfd")]
    EventFd(#[source] SyscallError),
    #[error("starting the trigger pump thread")]
    Spawn(#[source] io::Error),
}

/// What the async side and the thread share.
struct Control {
    wake: OwnedFd,
    stop: AtomicBool,
    /// Passes asked for by [`TriggerPump::drain`], and the last one the thread finished.
    flush_requested: AtomicU64,
    flush_done: AtomicU64,
    malformed: AtomicU64,
}

/// Reads trigger records on its own thread; see the module docs.
pub struct TriggerPump {
    rx: mpsc::UnboundedReceiver<Vec<TriggerEvent>>,
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

impl TriggerPump {
    /// Starts the thread on `ring`; `hook` runs on it for every record.
    pub fn start(ring: RingBuf<MapData>, hook: FreezeHook, wait: Wait) -> Result<Self, PumpError> {
        let control = Arc::new(Control {
            wake: thread::eventfd().map_err(PumpError::EventFd)?,
            stop: AtomicBool::new(false),
            flush_requested: AtomicU64::new(0),
            flush_done: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::clone(&control);
        let thread = std::thread::Builder::new()
            .name("lookback-freeze".to_owned())
            .spawn(move || pump(ring, hook, &shared, &tx, wait))
            .map_err(PumpError::Spawn)?;
        Ok(Self {
            rx,
            control,
            thread: Some(thread),
        })
    }

    /// Waits for the next batch of triggers, in ring order.
    pub async fn next_batch(&mut self) -> io::Result<Vec<TriggerEvent>> {
        self.rx.recv().await.ok_or_else(|| {
            io::Error::new(io::ErrorKind::BrokenPipe, "the trigger pump thread stopped")
        })
    }

    /// Every trigger in the ring now: asks the thread for one more pass, waits for it
    /// (briefly: it does nothing else), and returns what is queued.
    pub fn drain(&mut self) -> Vec<TriggerEvent> {
        let ticket = self.control.flush_requested.fetch_add(1, Ordering::AcqRel) + 1;
        thread::eventfd_signal(self.control.wake.as_fd());
        let deadline = Instant::now() + DRAIN_WAIT;
        while self.control.flush_done.load(Ordering::Acquire) < ticket
            && self.thread.as_ref().is_some_and(|t| !t.is_finished())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(100));
        }
        let mut out = Vec::new();
        while let Ok(batch) = self.rx.try_recv() {
            out.extend(batch);
        }
        out
    }

    /// Records that did not decode (counted, never fatal).
    pub fn malformed(&self) -> u64 {
        self.control.malformed.load(Ordering::Relaxed)
    }
}

impl Drop for TriggerPump {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        thread::eventfd_signal(self.control.wake.as_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: drain, hand over, wait; until stopped or nobody listens.
fn pump(
    mut ring: RingBuf<MapData>,
    mut hook: FreezeHook,
    control: &Control,
    tx: &mpsc::UnboundedSender<Vec<TriggerEvent>>,
    wait: Wait,
) {
    // A spinning thread stays at normal priority: in SCHED_FIFO it would starve its CPU,
    // and the kernel's RT throttling then stops it for 50 ms of every second (measured:
    // p99 98 ms).
    if wait == Wait::Sleep
        && let Err(e) = thread::set_fifo_priority(PUMP_PRIORITY)
    {
        log::debug!("trigger pump stays a normal thread: {e}");
    }
    loop {
        let ticket = control.flush_requested.load(Ordering::Acquire);
        let batch = drain_ring(&mut ring, &mut hook, control);
        if !batch.is_empty() && tx.send(batch).is_err() {
            return;
        }
        control.flush_done.fetch_max(ticket, Ordering::AcqRel);
        if control.stop.load(Ordering::Acquire) {
            return;
        }
        if wait == Wait::Spin {
            // The ring's positions are plain memory: `next()` above read them without a
            // syscall; stop and drain requests are seen through the atomics.
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: the ring's fd lives as long as `ring`, which outlives this borrow.
        let ring_fd = unsafe { BorrowedFd::borrow_raw(ring.as_raw_fd()) };
        match thread::poll_readable([ring_fd, control.wake.as_fd()]) {
            Ok([_, woken]) => {
                if woken {
                    thread::eventfd_clear(control.wake.as_fd());
                }
            }
            Err(e) => {
                log::error!("trigger pump: {e}; triggers are no longer read");
                return;
            }
        }
    }
}

/// Every record in the ring: the hook first, then decoding (which allocates).
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    hook: &mut FreezeHook,
    control: &Control,
) -> Vec<TriggerEvent> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        let record = match record_from_bytes(&item) {
            Ok(record) => record,
            Err(e) => {
                control.malformed.fetch_add(1, Ordering::Relaxed);
                log::debug!("dropping trigger record: {e}");
                continue;
            }
        };
        let stack = stack_from_bytes(&item);
        // 8 KiB copied before the freeze: ~0.2 µs, while the process is already frozen
        // in the kernel when its rule asks for that.
        let mut copy = stack_copy_from_bytes(&item);
        drop(item);
        if copy.is_none() && record.phase == PHASE_RUNNING {
            // Fired from the agent's context: the look that proved it left the stack.
            let entry_ns = record.timestamp_ns.saturating_sub(record.duration_ns);
            copy = super::inflight::stacks().take(record.tid, entry_ns);
        }
        // One entry per event, whatever number of rules it met: one record per rule here,
        // each hooked (the freeze decision is per rule) and delivered on its own.
        for rule_id in record_rules(&record) {
            let record = TriggerRecord {
                rule_id,
                rule_mask: 1 << rule_id,
                ..record
            };
            hook(&record);
            match TriggerEvent::from_record(&record) {
                Ok(mut event) => {
                    event.stack = stack_frames(&stack);
                    event.kernel_stack = kernel_stack_frames(&stack);
                    event.stack_copy.clone_from(&copy);
                    out.push(event);
                }
                Err(e) => {
                    control.malformed.fetch_add(1, Ordering::Relaxed);
                    log::debug!("dropping trigger record: {e}");
                }
            }
        }
    }
    out
}
