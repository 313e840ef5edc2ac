//! The slow half of `run`/`attach` snapshots on one background thread: whatever is pushed
//! is handed, in push order, to a work function (the `.lbsnap`, decode, symbols, trace
//! file), so the event loop copies the next trigger's rings and unfreezes its process at
//! once instead of after the previous trace file is written (60–250 ms).
//!
//! One thread, so files come out in trigger order. At most `capacity` jobs wait or run
//! (each holds a copy of every ring); the caller asks [`has_room`](WriteQueue::has_room)
//! before it copies a snapshot. Dropping the queue (or [`finish`](WriteQueue::finish))
//! runs everything pushed before it returns. The first failure is kept for the caller; the
//! jobs after it still run.
use std::{
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc},
    thread::JoinHandle,
};

use anyhow::Context as _;

/// The writer thread's nice value: decoding and compressing a trace takes a CPU for
/// 60–250 ms, which should not delay the next trigger's copy.
const BACKGROUND_NICE: i32 = 10;

/// What the background thread does with each job.
pub type Work<T> = Box<dyn FnMut(T) -> anyhow::Result<()> + Send>;

#[derive(Default)]
struct State {
    /// Jobs pushed and not finished (queued or running).
    in_flight: usize,
    /// The first failure not yet taken.
    error: Option<anyhow::Error>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a job finishes.
    done: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Only counters and an error behind it: consistent even after a panic elsewhere.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An ordered, bounded queue of jobs for one worker thread.
pub struct WriteQueue<T: Send + 'static> {
    tx: Option<mpsc::Sender<T>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    capacity: usize,
}

impl<T: Send + 'static> WriteQueue<T> {
    /// Starts the worker thread `name`; at most `capacity` (≥ 1) jobs in flight.
    pub fn start(name: &str, capacity: usize, mut work: Work<T>) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel::<T>();
        let shared = Arc::new(Shared::default());
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Behind the event loop, which copies the next snapshot and unfreezes its
                // process, and behind the traced program: the files can wait.
                if let Err(e) = crate::sys::thread::set_nice(BACKGROUND_NICE) {
                    log::debug!("writer thread keeps its priority: {e}");
                }
                for job in rx {
                    let result = work(job);
                    let mut state = worker.state();
                    state.in_flight = state.in_flight.saturating_sub(1);
                    if let Err(e) = result {
                        state.error.get_or_insert(e);
                    }
                    drop(state);
                    worker.done.notify_all();
                }
            })
            .with_context(|| format!("starting the {name} thread"))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            shared,
            capacity: capacity.max(1),
        })
    }

    /// Whether one more job fits.
    pub fn has_room(&self) -> bool {
        self.shared.state().in_flight < self.capacity
    }

    /// Jobs pushed and not finished.
    pub fn in_flight(&self) -> usize {
        self.shared.state().in_flight
    }

    /// Blocks until one more job fits.
    pub fn wait_for_room(&self) {
        let state = self.shared.state();
        let _room = self
            .shared
            .done
            .wait_while(state, |s| s.in_flight >= self.capacity)
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// The first failure of a job since the last call, if any.
    pub fn take_error(&self) -> Option<anyhow::Error> {
        self.shared.state().error.take()
    }

    /// Queues `job` (also beyond the capacity: the caller decides with
    /// [`has_room`](Self::has_room)).
    pub fn push(&mut self, job: T) -> anyhow::Result<()> {
        let tx = self.tx.as_ref().context("the writer thread is gone")?;
        self.shared.state().in_flight += 1;
        if tx.send(job).is_err() {
            // The thread ended (a panic in a job): nothing will run this one.
            self.shared.state().in_flight -= 1;
            anyhow::bail!("the writer thread is gone");
        }
        Ok(())
    }

    /// Runs everything queued, stops the thread, and returns the first failure not taken.
    pub fn finish(mut self) -> anyhow::Result<()> {
        self.join()?;
        self.take_error().map_or(Ok(()), Err)
    }

    fn join(&mut self) -> anyhow::Result<()> {
        drop(self.tx.take());
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => anyhow::bail!("the writer thread panicked"),
            _ => Ok(()),
        }
    }
}

impl<T: Send + 'static> Drop for WriteQueue<T> {
    /// Everything pushed is written before the session ends, also on an error path.
    fn drop(&mut self) {
        if let Err(e) = self.join() {
            log::error!("{e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, mpsc};

    use super::{Work, WriteQueue};

    /// A work function that records each job, after waiting for a go from `gate`.
    fn gated(seen: Arc<Mutex<Vec<u32>>>, gate: mpsc::Receiver<()>) -> Work<u32> {
        Box::new(move |n| {
            gate.recv().expect("gate");
            seen.lock().expect("seen").push(n);
            if n == 2 {
                anyhow::bail!("job {n} failed");
            }
            Ok(())
        })
    }

    #[test]
    fn jobs_run_in_order_and_the_capacity_counts_running_ones() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (go, gate) = mpsc::channel();
        let mut q =
            WriteQueue::start("test-writer", 2, gated(Arc::clone(&seen), gate)).expect("thread");
        assert!(q.has_room());
        q.push(1).expect("push");
        q.push(2).expect("push");
        assert!(!q.has_room(), "one running, one waiting: full");
        go.send(()).expect("go");
        q.wait_for_room();
        assert_eq!(q.in_flight(), 1);
        q.push(3).expect("push");
        go.send(()).expect("go");
        go.send(()).expect("go");
        let err = q.finish().expect_err("job 2 failed");
        assert_eq!(err.to_string(), "job 2 failed");
        assert_eq!(
            *seen.lock().expect("seen"),
            [1, 2, 3],
            "in order, all of them"
        );
    }

    #[test]
    fn dropping_the_queue_runs_what_was_queued() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (go, gate) = mpsc::channel();
        let mut q =
            WriteQueue::start("test-writer", 8, gated(Arc::clone(&seen), gate)).expect("thread");
        for n in [4, 5, 6] {
            q.push(n).expect("push");
            go.send(()).expect("go");
        }
        drop(q);
        assert_eq!(*seen.lock().expect("seen"), [4, 5, 6]);
    }

    #[test]
    fn an_error_is_taken_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (go, gate) = mpsc::channel();
        let mut q = WriteQueue::start("test-writer", 1, gated(seen, gate)).expect("thread");
        q.push(2).expect("push");
        go.send(()).expect("go");
        q.wait_for_room();
        assert!(q.take_error().is_some());
        assert!(q.take_error().is_none());
        q.finish().expect("nothing left to report");
    }
}
